// Llama-family pretraining by parity with the single-rank run: the tiny GPT of
// parallel_test_util.h built as a Llama (llama_test_util.h: RMSNorm, rotary embeddings, SwiGLU,
// grouped-query attention with 2 query groups for 4 heads, no biases, untied output layer;
// 4 layers) trains in fp32 in every parallel layout and follows the single-rank loss curve within
// 1e-5 per iteration and ends with its parameters (gathered from the per-rank checkpoint files,
// SwiGLU's per-rank [gate; up] rows put back in order) within 1e-5 of each tensor's scale.
//   np 2: TP2 + SP, PP2 (1F1B), PP2 interleaved, CP2 (ring; rotary positions are the tokens'
//         positions in the whole sequence), CP2 all-gather, DP2 with the distributed optimizer
//         and overlapped reduction and parameter gather;
//   np 4: TP2 x PP2 + SP, PP2 interleaved x DP2 (distributed optimizer, overlap), CP2 x PP2
//         interleaved, TP2 + SP x CP2;
//   np 8: TP2 x PP2 x DP2 (SP, distributed optimizer, overlap) and TP2 + SP x CP2 x PP2.
// Also: full and selective recomputation follow the curve (np 2, PP2), save/resume under PP2
// interleaved continues the uninterrupted curve bit for bit, and a TP2 x PP2 checkpoint converts
// to TP1 x PP1 and resumes on one rank on the same curve. bf16 and fp16 (parity in these layouts,
// exact resume, skipped fp16 steps): llama_half_precision_test.cpp.
#include <gtest/gtest.h>

#include "llama_test_util.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

void check_layout(const Fixture& f, const Layout& l, const TrainingSummary& ref,
                  const std::string& ref_save, double tol = 1e-5) {
  SCOPED_TRACE(l.name);
  TrainingArgs par = with_layout(llama_args(f), l);
  par.save = f.dir / ("llama_" + l.name);
  par.save_interval = 1000;
  const TrainingSummary p = pretrain(par);
  EXPECT_EQ(p.world_size, world()->size());
  EXPECT_EQ(p.iterations, 20);
  expect_same_curve(p, ref, tol, l.name);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3);  // it learns: the comparison is not idle
  // Untied output layer: no tied embedding to hold back, every bucket starts during backward.
  if (l.overlap) {
    EXPECT_EQ(p.grad_buckets_launched_in_backward, p.grad_buckets);
  }
  if (world()->rank() == 0) expect_same_params(par.save, ref_save, 20, tol);
  world()->barrier();
}

TEST(MpiLlamaTraining, LayoutsFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int W = world()->size();
  const std::string ref_save = f.dir / "llama_ref";
  const TrainingSummary ref = reference_curve(llama_args(f), ref_save);
  ASSERT_EQ(ref.losses.size(), 20u);
  std::vector<Layout> layouts;
  if (W == 2) {
    layouts = {{"tp2_sp", 2, 1, 0, 1, true},
               {"pp2", 1, 2},
               {"pp2_interleaved", 1, 2, 1},
               {"cp2_ring", 1, 1, 0, 2},
               {"cp2_allgather", 1, 1, 0, 2, false, false, false, false, "allgather"},
               {"dp2_distopt_overlap_pgather", 1, 1, 0, 1, false, true, true, true},
               {"pp2_full_recompute", 1, 2, 0, 1, false, false, false, false, "p2p", "full"},
               {"tp2_selective_recompute", 2, 1, 0, 1, false, false, false, false, "p2p", "selective"}};
  } else if (W == 4) {
    layouts = {{"tp2_pp2_sp", 2, 2, 0, 1, true},
               {"pp2_interleaved_dp2_distopt_overlap", 1, 2, 1, 1, false, true, true, true},
               {"cp2_pp2_interleaved", 1, 2, 1, 2},
               {"tp2_sp_cp2", 2, 1, 0, 2, true}};
  } else if (W == 8) {
    layouts = {{"tp2_pp2_dp2_sp_distopt_overlap", 2, 2, 0, 1, true, true, true, true},
               {"tp2_sp_cp2_pp2", 2, 2, 0, 2, true}};
  }
  for (const Layout& l : layouts) check_layout(f, l, ref, ref_save);
}

// Save at 10 under PP2 interleaved, resume to 20: the losses of 11..20 and the final parameters
// equal the uninterrupted run's bit for bit.
TEST(MpiLlamaTraining, SaveAndResumeAreExact) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at np 2";
  Fixture f;
  const Layout l{"pp2_interleaved", 1, 2, 1};
  expect_exact_resume(with_layout(llama_args(f), l), f.dir / "llama_full", f.dir / "llama_resume",
                      [](const TrainingArgs& a) { return pretrain(a); });
}

// A TP2 x PP2 Llama checkpoint converts to one rank (SwiGLU halves, query groups, the untied
// output layer) and resumes there on the same curve as the 4-rank run.
TEST(MpiLlamaTraining, ConvertedCheckpointResumesOnOneRank) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 4) GTEST_SKIP() << "runs at np 4";
  Fixture f;
  const Layout l{"tp2_pp2_sp", 2, 2, 0, 1, true};
  TrainingArgs first = with_layout(llama_args(f), l);
  first.save = f.dir / "llama_tp2pp2";
  first.save_interval = 10;
  const TrainingSummary whole = pretrain(first);
  if (world()->rank() == 0) {
    ConvertOptions c;
    c.load = first.save;
    c.save = f.dir / "llama_tp1";
    c.ckpt_step = 10;
    const ConvertResult r = convert_checkpoint(c);
    EXPECT_EQ(r.to.tensor_model_parallel_size, 1);
    TrainingArgs one = llama_args(f);
    one.load = c.save.string();
    const TrainingSummary rest = run_single(one);
    ASSERT_EQ(rest.losses.size(), 10u);
    for (size_t i = 0; i < 10; ++i)
      EXPECT_NEAR(rest.losses[i], whole.losses[10 + i], 1e-5 * whole.losses[10 + i]) << i;
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
