// The distributed optimizer's default torch_dist state, dp_reshardable, of T5 models
// (training/torch_dist_buckets_family.h): tests/reference/write_torch_dist_t5.py saves its T5
// model under TP2 x DP2 with the flat buckets of each rank's gradient buffer laid out from
// Megatron-Core's T5Model module tree (local modules, and Transformer Engine's: the norms fused
// into linear_qkv and linear_fc1, the decoder's pre_cross_attn_layernorm a norm of its own, the
// cross-attention's linear_proj before linear_q and linear_kv), and merged under another layout
// (one rank) the state is the writer's, per parameter, bit for bit. pretrain-t5 --ckpt-format
// torch_dist --use-distributed-optimizer writes the buckets the same module trees lay out (checked
// by the Python reader against them; tied, and untied with the head's own weight), resumes from
// them bit-exact, and (saved by several ranks) a single rank resumes from them as from this
// build's format. Mpi*: TP2 x DP2
// (np 4) and DP2 (np 2) in both orders.
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

const fs::path& fixtures() { return mt::python_fixtures("tests/reference/write_torch_dist_t5.py"); }

TEST(TorchDistT5Dp, FixtureStateMergesToTheWritersValues) {
  for (const char* name : {"t5_dp", "t5_dp_te"}) {
    SCOPED_TRACE(name);
    mt::expect_writers_optimizer_state(fixtures() / name, fixtures() / "t5_dp.ref");
    mt::expect_megatrons_buckets(fixtures() / name / "iter_0000007");  // the checker agrees with the writer
  }
}

// One rank (DP 1): the local order with the relative position biases and the tied head, and
// Transformer Engine's with learned positions and the untied head's own weight (the first in the
// buffer, being the last registered).
TEST(TorchDistT5Dp, SavesMegatronsBucketsAndResumesBitExact) {
  SharedDir dir;
  training::TrainingArgs a = mt::t5_args(dir.path(), 4);
  a.transformer_impl = "local";
  mt::save_dp_and_resume(dir, a, "t5_local");
  training::TrainingArgs untied = mt::t5_args(dir.path(), 4);
  untied.model.untie_embeddings_and_output_weights = true;
  untied.model.position_embedding_type = "learned_absolute";
  mt::save_dp_and_resume(dir, untied, "t5_te_untied");
}

TEST(MpiTorchDistT5Dp, SavesUnderTp2Dp2OrDp2AndResumesBitExact) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (DP2) and 4 (TP2 x DP2)";
  SharedDir dir;
  for (const char* impl : {"local", "transformer_engine"}) {
    training::TrainingArgs a = mt::t5_args(dir.path(), 4);
    if (W == 4) a.parallel.tensor_model_parallel_size = 2;
    a.transformer_impl = impl;
    mt::save_dp_and_resume(dir, a, "t5_" + std::to_string(W) + "_" + impl);
  }
}

}  // namespace
}  // namespace megatron
