// Every default that Megatron-LM's validate_args derives from other flags (FFN width, with
// --swiglu int((4h * 2/3) / 64) * 64; kv-channels; query groups; virtual pipeline stages from
// --num-layers-per-virtual-pipeline-stage; the padded vocabulary; the global batch; weight-decay
// bounds; the bias and position-embedding switches; sequence parallelism at TP 1) is derived the
// same way here: pretrain-gpt records them in a --ckpt-format torch checkpoint's arguments, and
// tests/reference/megatron_derived_args.py, validate_args' rules transcribed, derives them from the
// same flags and compares, for a grid of flag sets on one, two and four ranks.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "comm/communicator.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

using json = nlohmann::json;

struct FlagSet {
  int ranks;
  std::string flags;
};

void derived_as_megatron(const FlagSet& c) {
  const auto& f = cli_fixture();
  TempDir dir;
  const std::string save = (dir / "ckpt").string();
  const std::string run = " --mock-data --vocab-file " + f.vocab_file + " --merge-file " + f.merge_file +
                          " --train-iters 1 --lr 1e-3 --eval-iters 0 --save " + save +
                          " --save-interval 1 --ckpt-format torch";
  const std::string line =
      c.ranks == 1 ? "pretrain-gpt " + c.flags + run
                   : "launch --nproc_per_node " + std::to_string(c.ranks) +
                         " --nnodes 1 --master_addr localhost --master_port 6000 pretrain_gpt.py " +
                         c.flags + run;
  const auto r = run_cli(line + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << line << "\n" << r.output;
  const auto check = run_command("/usr/bin/python3 " +
                                 (source_dir() / "tests/reference/megatron_derived_args.py").string() +
                                 " check " + f.vocab_file + " " + std::to_string(c.ranks) + " " + save +
                                 " -- " + c.flags + " 2>&1");
  ASSERT_EQ(check.exit_code, 0) << check.output;
  const json j = json::parse(check.output);
  EXPECT_GE(j["compared"].size(), 18u);
  EXPECT_TRUE(j["mismatches"].empty()) << c.flags << "\n" << j["mismatches"].dump(1);
}

TEST(DerivedArgs, SingleRankFlagSetsDeriveAsMegatron) {
  const std::vector<FlagSet> grid = {
      {1, "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16"
          " --max-position-embeddings 16 --micro-batch-size 2"},
      {1, "--num-layers 1 --hidden-size 96 --num-attention-heads 4 --swiglu --disable-bias-linear"
          " --seq-length 16 --max-position-embeddings 32 --micro-batch-size 1 --global-batch-size 2"},
      {1, "--num-layers 1 --hidden-size 80 --num-attention-heads 5 --swiglu --group-query-attention"
          " --num-query-groups 1 --normalization RMSNorm --use-rotary-position-embeddings"
          " --make-vocab-size-divisible-by 64 --seq-length 16 --max-position-embeddings 16"
          " --micro-batch-size 1"},
      {1, "--num-layers 1 --hidden-size 32 --num-attention-heads 4 --kv-channels 8"
          " --ffn-hidden-size 100 --weight-decay 0.05 --bf16 --sequence-parallel --seq-length 16"
          " --max-position-embeddings 16 --micro-batch-size 2"},
      {1, "--num-layers 1 --hidden-size 200 --num-attention-heads 8 --swiglu --group-query-attention"
          " --num-query-groups 8 --make-vocab-size-divisible-by 1 --add-qkv-bias --disable-bias-linear"
          " --seq-length 8 --max-position-embeddings 8 --micro-batch-size 1"},
  };
  for (const FlagSet& c : grid) derived_as_megatron(c);
}

TEST(DerivedArgs, ParallelFlagSetsDeriveAsMegatron) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  // Data parallel: the global batch defaults to micro-batch x DP.
  derived_as_megatron({2, "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
                          " --max-position-embeddings 16 --micro-batch-size 2"});
  // TP 2 x PP 2, interleaved: virtual stages from layers per virtual stage, the vocabulary
  // padded to a multiple of divisor x TP, sequence parallelism kept.
  derived_as_megatron({4, "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
                          " --max-position-embeddings 16 --tensor-model-parallel-size 2"
                          " --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"
                          " --micro-batch-size 1 --global-batch-size 4 --sequence-parallel"});
}

}  // namespace
}  // namespace megatron::testing
