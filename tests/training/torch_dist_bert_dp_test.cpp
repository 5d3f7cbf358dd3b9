// The distributed optimizer's default torch_dist state, dp_reshardable, of BERT models
// (training/torch_dist_buckets_family.h): tests/reference/write_torch_dist_bert.py saves its BERT
// model under TP2 x PP2 x DP2 with the flat buckets of each rank's gradient buffer laid out from
// Megatron-Core's BertModel module tree (local modules, and Transformer Engine's with the norms
// fused), and merged under another layout (one rank) the state is the writer's, per parameter,
// bit for bit. pretrain-bert --ckpt-format torch_dist --use-distributed-optimizer writes the
// buckets the same module trees lay out (checked by the Python reader against them), resumes from
// them bit-exact, and (saved by several ranks) a single rank resumes from them as from this
// build's format. Mpi*: TP2 x DP2
// (np 4) and PP2 (np 2: the tied embedding's buckets of their own) in both orders.
#include <gtest/gtest.h>

#include <string>

#include "parallel_test_util.h"
#include "test_util.h"
#include "torch_dist_family_test_util.h"
#include "torch_dist_test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using namespace training::parallel_test;

const fs::path& fixtures() { return mt::python_fixtures("tests/reference/write_torch_dist_bert.py"); }

// Both orders give the same state: the same per-parameter values stored at other places of the
// flat buckets, which the last stage splits into three (the heads, the tied embedding's copy on
// its own, the layers), so each merges to the writer's values only in its own order.
TEST(TorchDistBertDp, FixtureStateMergesToTheWritersValues) {
  for (const char* name : {"bert_dp", "bert_dp_te"}) {
    SCOPED_TRACE(name);
    mt::expect_writers_optimizer_state(fixtures() / name, fixtures() / "bert_dp.ref");
    mt::expect_megatrons_buckets(fixtures() / name / "iter_0000007");  // the checker agrees with the writer
  }
}

// One rank (DP 1) in Transformer Engine's order, Megatron-LM's default (the local order: Mpi*).
TEST(TorchDistBertDp, SavesMegatronsBucketsAndResumesBitExact) {
  mt::BertRun run;
  mt::save_dp_and_resume(run.dir, run.args(4), "bert");
}

TEST(MpiTorchDistBertDp, SavesUnderTp2Dp2OrPp2AndResumesBitExact) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (PP2) and 4 (TP2 x DP2)";
  mt::BertRun run;
  for (const char* impl : {"local", "transformer_engine"}) {
    training::TrainingArgs a = run.args(4);
    if (W == 2) a.parallel.pipeline_model_parallel_size = 2;
    else a.parallel.tensor_model_parallel_size = 2;
    a.transformer_impl = impl;
    mt::save_dp_and_resume(run.dir, a, "bert_" + std::to_string(W) + "_" + impl);
  }
}

}  // namespace
}  // namespace megatron
