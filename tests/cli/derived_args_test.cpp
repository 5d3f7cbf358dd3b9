// Every default that Megatron-LM's validate_args derives from other flags (FFN width, with
// --swiglu int((4h * 2/3) / 64) * 64; kv-channels; query groups; virtual pipeline stages from
// --num-layers-per-virtual-pipeline-stage; the padded vocabulary; the global batch; weight-decay
// bounds; the bias and position-embedding switches; sequence parallelism at TP 1) is derived the
// same way here: pretrain-gpt records them in a --ckpt-format torch checkpoint's arguments, and
// tests/reference/megatron_derived_args.py, validate_args' rules transcribed, derives them from the
// same flags and compares, for a grid of flag sets on one, two and four ranks.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

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

// Trains each flag set for one iteration into a --ckpt-format torch checkpoint, then has the
// reference derive and compare every run's arguments (one Python start).
void derived_as_megatron(const std::vector<FlagSet>& grid) {
  const auto& f = cli_fixture();
  TempDir dir;
  json runs = json::array();
  for (size_t i = 0; i < grid.size(); ++i) {
    const FlagSet& c = grid[i];
    const std::string save = (dir / ("run" + std::to_string(i))).string();
    const std::string run = " --data-path " + f.data_prefix + " --split 98,2,0 --vocab-file " +
                            f.vocab_file + " --merge-file " + f.merge_file +
                            " --train-iters 1 --lr 1e-3 --eval-iters 0 --save " + save +
                            " --save-interval 1 --ckpt-format torch";
    const std::string line =
        c.ranks == 1 ? "pretrain-gpt " + c.flags + run
                     : "launch --nproc_per_node " + std::to_string(c.ranks) +
                           " --nnodes 1 --master_addr localhost --master_port 6000 pretrain_gpt.py " +
                           c.flags + run;
    const auto r = run_cli(line + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << line << "\n" << r.output;
    json flags = json::array();
    std::istringstream words(c.flags);
    for (std::string w; words >> w;) flags.push_back(w);
    runs.push_back({{"world_size", c.ranks}, {"save", save}, {"flags", flags}});
  }
  write_file(dir / "runs.json", runs.dump());
  const auto check = run_command("/usr/bin/python3 " +
                                 (source_dir() / "tests/reference/megatron_derived_args.py").string() +
                                 " check " + f.vocab_file + " " + (dir / "runs.json").string() + " 2>&1");
  ASSERT_EQ(check.exit_code, 0) << check.output;
  std::istringstream lines(check.output);
  size_t checked = 0;
  for (std::string l; std::getline(lines, l); ++checked) {
    const json j = json::parse(l);
    EXPECT_GE(j["compared"].size(), 18u);
    EXPECT_TRUE(j["mismatches"].empty()) << grid[checked].flags << "\n" << j["mismatches"].dump(1);
  }
  EXPECT_EQ(checked, grid.size()) << check.output;
}

TEST(DerivedArgs, SingleRankFlagSetsDeriveAsMegatron) {
  derived_as_megatron({
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
  });
}

TEST(DerivedArgs, ParallelFlagSetsDeriveAsMegatron) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  derived_as_megatron({
      // Data parallel: the global batch defaults to micro-batch x DP.
      {2, "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
          " --max-position-embeddings 16 --micro-batch-size 2"},
      // TP 2 x PP 2, interleaved: virtual stages from layers per virtual stage, the vocabulary
      // padded to a multiple of divisor x TP, sequence parallelism kept.
      {4, "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
          " --max-position-embeddings 16 --tensor-model-parallel-size 2"
          " --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"
          " --micro-batch-size 1 --global-batch-size 4 --sequence-parallel"},
  });
}

}  // namespace
}  // namespace megatron::testing
