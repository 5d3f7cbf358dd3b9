// The global batch size of every iteration, its number of micro-batches and the samples consumed
// before it, under constant batches, --rampup-batch-size and --step-batch-size-schedule with
// sample- and iteration-based training, against Megatron's calculator and training loop
// transcribed in tests/reference/num_microbatches_calculator.py; and a step schedule with
// --train-iters run end to end (the log line's consumed samples and global batch per iteration).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "parallel_test_util.h"
#include "test_util.h"
#include "training/batch_size_schedule.h"

namespace megatron::training {
namespace {

namespace mt = megatron::testing;
using json = nlohmann::json;

json megatron_reference(const json& config) {
  const auto r = mt::run_command("/usr/bin/python3 " +
                                 (mt::source_dir() / "tests/reference/num_microbatches_calculator.py").string() +
                                 " '" + config.dump() + "' 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return json::parse(r.output);
}

struct Case {
  int64_t gbs, mbs, dp, seq;
  std::vector<int64_t> rampup;
  std::string step;
  int64_t train_iters, train_samples;
};

TEST(BatchScheduleReference, EveryIterationMatchesMegatronsCalculator) {
  const std::vector<Case> cases = {
      {8, 2, 1, 16, {}, "", 7, 0},                    // constant, iterations
      {8, 1, 2, 16, {}, "", 0, 61},                   // constant, samples (partial batch dropped)
      {8, 1, 1, 16, {1, 1, 9}, "", 0, 60},            // Python's float division at the boundary
      {16, 2, 2, 16, {4, 4, 50}, "", 0, 200},         // ramp-up over data-parallel ranks
      {12, 1, 1, 16, {3, 3, 17}, "", 0, 100},
      {0, 1, 1, 16, {}, "0:2 64:4 160:8", 20, 0},     // step schedule, iterations (tokens / seq)
      {0, 2, 1, 8, {}, "0:2 1.5k:4 4K:8", 30, 0},
      {0, 1, 2, 32, {}, "0:4 0.5k:8", 12, 0},
  };
  for (const Case& c : cases) {
    const BatchSizeSchedule s =
        !c.rampup.empty() ? BatchSizeSchedule::rampup(c.rampup[0], c.rampup[1], c.rampup[2], c.gbs)
        : !c.step.empty() ? BatchSizeSchedule::step(c.step, c.seq)
                          : BatchSizeSchedule::constant(c.gbs);
    const int64_t iters = c.train_iters > 0 ? c.train_iters : s.train_iters_for_samples(c.train_samples);
    json config = {{"global_batch_size", c.gbs}, {"micro_batch_size", c.mbs},
                   {"data_parallel_size", c.dp}, {"seq_length", c.seq},
                   {"rampup_batch_size", c.rampup.empty() ? json(nullptr) : json(c.rampup)},
                   {"step_batch_size_schedule", c.step.empty() ? json(nullptr) : json(c.step)},
                   {"train_iters", c.train_iters > 0 ? json(c.train_iters) : json(nullptr)},
                   {"train_samples", c.train_samples > 0 ? json(c.train_samples) : json(nullptr)}};
    const json ref = megatron_reference(config);
    const std::string what = config.dump();
    ASSERT_EQ(ref["train_iters"].get<int64_t>(), iters) << what;
    s.validate_against(0, 0, iters, c.mbs, c.dp, 1);
    int64_t consumed = 0;
    for (int64_t it = 0; it < iters; ++it) {
      const json& row = ref["iterations"][size_t(it)];
      const int64_t b = s.global_batch_size(consumed);
      EXPECT_EQ(b, row[0].get<int64_t>()) << what << " iteration " << it + 1;
      EXPECT_EQ(b / (c.mbs * c.dp), row[1].get<int64_t>()) << what << " iteration " << it + 1;
      EXPECT_EQ(consumed, row[2].get<int64_t>()) << what << " iteration " << it + 1;
      consumed += b;
    }
  }
}

// Current Megatron-LM takes a step schedule with --train-iters (the 175B example's form): each
// iteration consumes the batch the schedule gives for the samples consumed before it.
TEST(BatchScheduleReference, AStepScheduleTrainsForTrainItersAsMegatronCounts) {
  mt::TempDir dir;
  parallel_test::write_corpus((dir / "corpus").string());
  const auto r = mt::run_command(
      mt::cli_path().string() +
      " pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
      " --max-position-embeddings 16 --micro-batch-size 1 --train-iters 9 --lr 1e-3"
      " --step-batch-size-schedule '0:1 48:2 128:4' --data-path " + (dir / "corpus").string() +
      " --split 100,0,0 --tokenizer-type NullTokenizer --vocab-size 64 --log-interval 1"
      " --eval-iters 0 --eval-interval 100 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json ref = megatron_reference({{"global_batch_size", nullptr}, {"micro_batch_size", 1},
                                       {"data_parallel_size", 1}, {"seq_length", 16},
                                       {"rampup_batch_size", nullptr},
                                       {"step_batch_size_schedule", "0:1 48:2 128:4"},
                                       {"train_iters", 9}, {"train_samples", nullptr}});
  const std::regex line(R"(iteration\s+(\d+)/\s*9 \| consumed samples:\s+(\d+) \|.*global batch size:\s+(\d+) \|)");
  std::istringstream in(r.output);
  int seen = 0;
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    const int64_t it = std::stoll(m[1].str());
    const json& row = ref["iterations"][size_t(it - 1)];
    // The log line reports the samples consumed after the iteration and that iteration's batch.
    EXPECT_EQ(std::stoll(m[3].str()), row[0].get<int64_t>()) << l;
    EXPECT_EQ(std::stoll(m[2].str()), row[2].get<int64_t>() + row[0].get<int64_t>()) << l;
    ++seen;
  }
  EXPECT_EQ(seen, 9) << r.output;
}

}  // namespace
}  // namespace megatron::training
