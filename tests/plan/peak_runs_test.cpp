// `megatron plan`'s prediction against real training runs of the same command lines on this
// machine's CPU: the peak of the host allocator and of the resident set (Megatron's report_memory
// line, "max allocated" and "max reserved") within 10% of the predicted ones (below), for
// single-rank runs (an fp32 GPT whose weights dominate; a bf16 Llama-style model whose attention
// probabilities dominate) and 4-rank runs (TP 2 x PP 2 with sequence parallelism; DP 2 x CP 2
// with the distributed optimizer in bf16).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "test_util.h"

namespace megatron::testing {
namespace {

const char* kRun =
    " --lr 1e-4 --mock-data --tokenizer-type NullTokenizer --vocab-size 4100 "
    "--eval-iters 0 --train-iters 3 --log-interval 1";

struct Peak {
  double allocated = 0, resident = 0;  // MiB
};

// The last report_memory line of each rank.
std::map<int, Peak> measured(const std::string& output) {
  std::map<int, Peak> out;
  const std::regex re(
      R"(\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\) \| allocated: \S+ \| )"
      R"(max allocated: (\S+) \| reserved: \S+ \| max reserved: (\S+))");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    out[std::stoi((*it)[1])] = {std::stod((*it)[2]), std::stod((*it)[3])};
  return out;
}

// Every rank's allocator peak within 10%, and the resident peak of each stage's most loaded rank
// within 10% with no rank of the stage above the prediction by more than 10%: ranks of one stage
// allocate the same tensors, but their resident sets differ by their part in the gradient
// reduction (Open MPI's non-blocking reduce-scatter reduces the whole message on the ranks that
// receive in its binomial tree, and only those touch its two-message buffer), and the plan
// predicts the most loaded one.
void expect_peaks(const std::string& flags, int world, int ranks_per_stage) {
  const std::string plan_cmd =
      "plan " + flags + kRun + " --world-size " + std::to_string(world) + " --json 2>&1";
  CommandResult p = run_cli(plan_cmd);
  ASSERT_EQ(p.exit_code, 0) << plan_cmd << "\n" << p.output;
  const nlohmann::json plan = nlohmann::json::parse(p.output.substr(p.output.find('{')));
  const double process = plan["prediction"]["process_resident"].get<double>();
  const std::string train =
      (world > 1 ? "launch --nproc_per_node " + std::to_string(world) + " " : "") +
      "pretrain-gpt " + flags + kRun + " 2>&1";
  CommandResult t = run_cli(train);
  ASSERT_EQ(t.exit_code, 0) << train << "\n" << t.output;
  const std::map<int, Peak> m = measured(t.output);
  ASSERT_FALSE(m.empty()) << t.output;
  const double mib = 1024.0 * 1024.0;
  std::map<size_t, std::pair<int, double>> most_loaded;  // stage -> (rank, resident)
  for (const auto& [rank, peak] : m) {
    const size_t stage = size_t(rank / ranks_per_stage);
    const nlohmann::json& st = plan["prediction"]["stages"][stage];
    const double allocated = st["peak"].get<double>() / mib;
    const double resident =
        (st["peak"].get<double>() + st["resident_overhead"].get<double>() + process) / mib;
    EXPECT_NEAR(allocated / peak.allocated, 1.0, 0.10)
        << "rank " << rank << ": predicted " << allocated << " MiB, max allocated "
        << peak.allocated;
    EXPECT_LE(peak.resident, 1.10 * resident)
        << "rank " << rank << ": predicted " << resident << " MiB, max reserved " << peak.resident;
    auto [it, fresh] = most_loaded.try_emplace(stage, rank, peak.resident);
    if (!fresh && peak.resident > it->second.second) it->second = {rank, peak.resident};
  }
  for (const auto& [stage, loaded] : most_loaded) {
    const nlohmann::json& st = plan["prediction"]["stages"][stage];
    const double resident =
        (st["peak"].get<double>() + st["resident_overhead"].get<double>() + process) / mib;
    EXPECT_NEAR(resident / loaded.second, 1.0, 0.10)
        << "stage " << stage << ": predicted " << resident << " MiB, max reserved of its most "
        << "loaded rank (" << loaded.first << ") " << loaded.second;
  }
}

TEST(PlanRealRuns, PeaksWithinTenPercentOnOneRank) {
  // fp32 GPT with a long position table: weights, gradients and Adam moments dominate.
  expect_peaks(
      "--num-layers 1 --hidden-size 256 --num-attention-heads 4 --seq-length 256 "
      "--max-position-embeddings 65536 --micro-batch-size 1 --global-batch-size 2",
      1, 1);
  // bf16 Llama-style model over 1024 tokens: the saved attention probabilities dominate.
  expect_peaks(
      "--num-layers 2 --hidden-size 256 --num-attention-heads 8 --group-query-attention "
      "--num-query-groups 4 --swiglu --normalization RMSNorm --position-embedding-type rope "
      "--untie-embeddings-and-output-weights --disable-bias-linear --ffn-hidden-size 512 --bf16 "
      "--seq-length 1024 --micro-batch-size 1 --global-batch-size 1",
      1, 1);
}

TEST(PlanRealRuns, PeaksWithinTenPercentOnFourRanks) {
  // TP 2 x PP 2 with sequence parallelism: the first stage holds the position table.
  expect_peaks(
      "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
      "--max-position-embeddings 32768 --micro-batch-size 1 --global-batch-size 4 "
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel",
      4, 2);
  // DP 2 x CP 2, distributed optimizer, bf16 (one stage: every rank is stage 0).
  expect_peaks(
      "--num-layers 2 --hidden-size 256 --num-attention-heads 8 --group-query-attention "
      "--num-query-groups 4 --swiglu --normalization RMSNorm --position-embedding-type rope "
      "--disable-bias-linear --ffn-hidden-size 512 --bf16 --seq-length 1024 --micro-batch-size 1 "
      "--global-batch-size 2 --context-parallel-size 2 --use-distributed-optimizer",
      4, 4);
}

}  // namespace
}  // namespace megatron::testing
