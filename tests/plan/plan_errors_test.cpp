// `megatron plan` refuses what the trainer refuses, naming the flag, and its own flags' mistakes:
// a world the layout does not divide, a batch the world does not divide, mock data with too small
// a vocabulary, mixture-of-experts settings the trainer refuses, expert parallelism (which the
// plan does not model), an unknown device, a search without a device, too few measured steps.
#include <gtest/gtest.h>

#include "test_util.h"

namespace megatron::testing {
namespace {

const char* kRun =
    "plan --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 "
    "--micro-batch-size 2 --global-batch-size 8 --train-iters 10 --lr 1e-4 --mock-data "
    "--tokenizer-type NullTokenizer";

// The run with `flags` (4 layers and a vocabulary of 4100 unless they say otherwise).
void expect_error(std::string flags, const std::string& message) {
  if (flags.find("--num-layers") == std::string::npos) flags += " --num-layers 4";
  if (flags.find("--vocab-size") == std::string::npos) flags += " --vocab-size 4100";
  CommandResult r = run_cli(std::string(kRun) + " " + flags + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << flags << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
}

TEST(PlanErrors, NamesTheFlag) {
  expect_error("--tensor-model-parallel-size 2 --world-size 3",
               "the world size 3 is not divisible by --tensor-model-parallel-size 2");
  expect_error("--world-size 3", "--global-batch-size (8) must be divisible by --micro-batch-size (2)");
  expect_error("--num-layers 5 --pipeline-model-parallel-size 2 --world-size 2",
               "--pipeline-model-parallel-size");
  expect_error("--vocab-size 1000", "--mock-data: Megatron's mock documents hold token ids up to 4094");
  expect_error("--num-experts 8", "--num-experts");
  // Expert parallelism is not in the plan's model, whatever the trainer takes; MoE layouts the
  // trainer refuses are refused too.
  expect_error("--num-experts 4 --disable-bias-linear --expert-model-parallel-size 2 "
               "--world-size 2",
               "plan: --expert-model-parallel-size 2: the plan does not model expert parallelism");
  expect_error("--num-experts 4 --disable-bias-linear --tensor-model-parallel-size 2 "
               "--expert-tensor-parallel-size 1 --world-size 2",
               "plan: --expert-tensor-parallel-size 1 differs from --tensor-model-parallel-size 2");
  expect_error("--device tpu", "--device");
  expect_error("--search", "--search needs a device");
  expect_error("--measure --measure-iters 1", "--measure-iters must be >= 2");
  expect_error("--search --device h100 --device-memory-gib -1", "--device-memory-gib must be > 0");
  expect_error("--world-size 0", "--world-size");
}

}  // namespace
}  // namespace megatron::testing
