// `megatron plan --search` on this machine: for a small model over a world of 2 ranks (one per
// core), the layout the search ranks first is measured against the other kinds of layout (data,
// tensor + sequence, pipeline and context parallel) in real 2-rank runs, and its step time is
// within 15% of the best of them. Each layout's time is its fastest step after the first (the
// least disturbed by other work on the machine). Also: the table and JSON agree, every listed
// layout is one the trainer accepts, and the search names what it needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "test_util.h"

namespace megatron::testing {
namespace {

const char* kModel =
    " --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 512 "
    "--max-position-embeddings 512 --global-batch-size 4 --lr 1e-4 --mock-data "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --eval-iters 0";

std::string flags_of(const nlohmann::json& c) {
  std::string f = " --micro-batch-size " + std::to_string(c["micro_batch_size"].get<int64_t>()) +
                  " --tensor-model-parallel-size " +
                  std::to_string(c["tensor_model_parallel_size"].get<int>()) +
                  " --pipeline-model-parallel-size " +
                  std::to_string(c["pipeline_model_parallel_size"].get<int>()) +
                  " --context-parallel-size " +
                  std::to_string(c["context_parallel_size"].get<int>());
  const int vp = c["virtual_pipeline_model_parallel_size"].get<int>();
  if (vp > 1)
    f += " --num-layers-per-virtual-pipeline-stage " +
         std::to_string(4 / c["pipeline_model_parallel_size"].get<int>() / vp);
  if (c["sequence_parallel"].get<bool>()) f += " --sequence-parallel";
  if (c["use_distributed_optimizer"].get<bool>()) f += " --use-distributed-optimizer";
  const std::string rec = c["recompute"].get<std::string>();
  if (rec == "selective") f += " --recompute-granularity selective";
  if (rec == "full") f += " --recompute-granularity full --recompute-method uniform";
  return f;
}

// The fastest step after the first of a 2-rank run of `layout`, in ms.
double step_ms(const std::string& layout) {
  const std::string cmd = std::string("launch --nproc_per_node 2 pretrain-gpt") + kModel + layout +
                          " --train-iters 4 --log-interval 1 2>&1";
  CommandResult r = run_cli(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  std::vector<double> ms;
  const std::regex re(R"(elapsed time per iteration \(ms\): ([0-9.]+))");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), re), end; it != end; ++it)
    ms.push_back(std::stod((*it)[1]));
  EXPECT_GE(ms.size(), 2u) << r.output;
  return ms.size() < 2 ? 1e30 : *std::min_element(ms.begin() + 1, ms.end());
}

TEST(PlanSearch, PickWithinFifteenPercentOfTheBestMeasuredLayout) {
  CommandResult p = run_cli(
      std::string("plan") + kModel +
      " --micro-batch-size 1 --train-iters 4 --world-size 2 --search --device cpu --json 2>&1");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const nlohmann::json plan = nlohmann::json::parse(p.output.substr(p.output.find('{')));
  const nlohmann::json& search = plan["search"];
  ASSERT_FALSE(search.empty());
  ASSERT_TRUE(search[0]["fits"].get<bool>());
  for (size_t i = 1; i < search.size(); ++i) {  // fitting ones first, by estimated time
    if (search[i]["fits"].get<bool>() && search[i - 1]["fits"].get<bool>()) {
      EXPECT_LE(search[i - 1]["step_seconds"].get<double>(),
                search[i]["step_seconds"].get<double>());
    }
  }
  const std::string pick = flags_of(search[0]);
  // One of each kind of layout of the world of 2, at the run's micro-batch size (and DP with 2).
  const std::vector<std::string> others = {
      " --micro-batch-size 1", " --micro-batch-size 2",
      " --micro-batch-size 1 --tensor-model-parallel-size 2 --sequence-parallel",
      " --micro-batch-size 1 --pipeline-model-parallel-size 2",
      " --micro-batch-size 1 --context-parallel-size 2"};
  double picked = step_ms(pick);
  std::printf("search pick%s: %.1f ms\n", pick.c_str(), picked);
  double best = picked;
  std::string best_layout = pick;
  for (const std::string& l : others) {
    const double t = step_ms(l);
    std::printf("layout%s: %.1f ms\n", l.c_str(), t);
    if (t < best) {
      best = t;
      best_layout = l;
    }
  }
  // Other work on the machine can slow one run: measure both again, each keeping its fastest.
  if (picked > 1.15 * best && best_layout != pick) {
    picked = std::min(picked, step_ms(pick));
    best = std::min(best, step_ms(best_layout));
    std::printf("again: pick %.1f ms, best %.1f ms\n", picked, best);
  }
  EXPECT_LE(picked, 1.15 * best) << "search pick" << pick << ": " << picked << " ms; best measured"
                                 << best_layout << ": " << best << " ms";
}

TEST(PlanSearch, TableListsTheFittingLayoutsAndNamesWhatItNeeds) {
  CommandResult t = run_cli(std::string("plan") + kModel +
                            " --micro-batch-size 1 --train-iters 5 --world-size 4 --search "
                            "--device-tflops 10 --device-memory-gib 4 --top 5 2>&1");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find(
                "layout search on a device as given by --device-tflops and --device-memory-gib"),
            std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("rank  TP   PP   VP   CP   DP   mbs"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("\n   5  "), std::string::npos) << t.output;
  EXPECT_EQ(t.output.find("\n   6  "), std::string::npos) << t.output;
  // A device too small for any layout.
  CommandResult none = run_cli(std::string("plan") + kModel +
                               " --micro-batch-size 1 --train-iters 5 --world-size 2 --search "
                               "--device h100 --device-memory-gib 0.01 2>&1");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("no layout fits"), std::string::npos) << none.output;
  // --search without a device.
  CommandResult bad =
      run_cli(std::string("plan") + kModel + " --micro-batch-size 1 --train-iters 5 --search 2>&1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("--search needs a device"), std::string::npos) << bad.output;
}

// With mixture-of-experts layers the search covers pipeline, context, tensor (with and without
// sequence parallelism) and data parallelism at expert-parallel size 1, and the step time counts
// the FLOPs of the experts a token is routed to: Megatron's formula, worked by hand.
TEST(PlanSearch, MixtureOfExpertsLayoutsAndActiveExpertFlops) {
  CommandResult p = run_cli(
      "plan --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 "
      "--max-position-embeddings 64 --micro-batch-size 1 --global-batch-size 4 --lr 1e-4 "
      "--mock-data --tokenizer-type NullTokenizer --vocab-size 4100 --train-iters 3 "
      "--num-experts 4 --moe-router-topk 2 --disable-bias-linear --world-size 4 --search "
      "--device h100 --json 2>&1");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const nlohmann::json plan = nlohmann::json::parse(p.output.substr(p.output.find('{')));
  const nlohmann::json& search = plan["search"];
  ASSERT_FALSE(search.empty());
  std::set<int> tps, pps, cps;
  bool sequence_parallel = false;
  for (const nlohmann::json& c : search) {
    sequence_parallel = sequence_parallel || c["sequence_parallel"].get<bool>();
    tps.insert(c["tensor_model_parallel_size"].get<int>());
    pps.insert(c["pipeline_model_parallel_size"].get<int>());
    cps.insert(c["context_parallel_size"].get<int>());
  }
  EXPECT_EQ(tps, (std::set<int>{1, 2, 4}));
  EXPECT_EQ(pps, (std::set<int>{1, 2}));
  EXPECT_EQ(cps, (std::set<int>{1, 2, 4}));
  EXPECT_TRUE(sequence_parallel);
  // B s (6 h W 2 + 6 L (h (q + 2 kv) + q h) + 6 h V) + B s^2 6 q L with the MLP widths
  // W = 2 MoE layers x top-2 x 512 (the experts' width, 4h), V = 4224 (4100 padded).
  const double B = 4, s = 64, h = 128, L = 2, V = 4224, W = 2 * 2 * 512;
  const double flops = B * s * (6 * h * W * 2 + 6 * L * (h * 3 * h + h * h) + 6 * h * V) +
                       B * s * s * 6 * h * L;
  EXPECT_EQ(plan["time"]["model_flops"].get<double>(), flops);
  // The text names the experts, with --moe-layer-freq as a pattern.
  CommandResult t = run_cli(
      "plan --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 "
      "--micro-batch-size 1 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer --vocab-size 4100 "
      "--train-iters 3 --num-experts 4 --moe-router-topk 2 --disable-bias-linear "
      "--moe-shared-expert-intermediate-size 64 --moe-layer-freq '[0,1,1,1]' 2>&1");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("mixture of experts: 3 of 4 layers with 4 experts of width 512, top-2, "
                          "a shared expert of width 64; every expert on every rank"),
            std::string::npos)
      << t.output;
}

// On a GPU the attention probabilities are recomputed in the backward, not kept: the prediction
// for a GPU device holds exactly batch x heads x seq x seq float32 per layer less per micro-batch
// than the CPU's.
TEST(PlanSearch, GpuDevicesKeepNoAttentionProbabilities) {
  const std::string model =
      "plan --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
      "--max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 2 --lr 1e-4 "
      "--mock-data --tokenizer-type NullTokenizer --vocab-size 4100 --train-iters 3 --json ";
  auto per_microbatch = [&](const std::string& device) {
    CommandResult p = run_cli(model + device + " 2>&1");
    EXPECT_EQ(p.exit_code, 0) << p.output;
    const nlohmann::json plan = nlohmann::json::parse(p.output.substr(p.output.find('{')));
    return plan["prediction"]["stages"][0]["activations_per_microbatch"].get<double>();
  };
  const double cpu = per_microbatch("--device cpu"), gpu = per_microbatch("--device h100");
  EXPECT_EQ(cpu - gpu, 2.0 /*layers*/ * 2 * 4 * 32 * 32 * 4 /*bytes*/);
}

}  // namespace
}  // namespace megatron::testing
