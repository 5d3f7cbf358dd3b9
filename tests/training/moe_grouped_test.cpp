// The grouped experts (--moe-grouped-gemm) under tensor, sequence, expert and expert-tensor
// parallelism: each layout follows the single-rank grouped run's curve, MoE losses included
// (under mpirun; the single-rank grouped run equals the sequential experts bit for bit:
// tests/model/moe_reference_test.cpp). With tensor parallelism and no sequence parallelism
// every rank holds whole sequences and the experts all-reduce their own outputs; otherwise the
// token dispatcher moves the rows. A grouped run saved under EP2 x TP2 resumes bit for bit.
#include <gtest/gtest.h>

#include "moe_test_util.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

TrainingArgs grouped_args(const Fixture& f, int64_t iters) {
  TrainingArgs a = moe_args(f, iters);
  a.model.moe_grouped_gemm = true;
  return a;
}

TEST(MpiMoeGrouped, GroupedExpertsFollowTheSingleRankCurveInEveryLayout) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  struct L { std::string name; int tp; bool sp; int ep, etp; const char* dispatcher; bool dist_opt; };
  std::vector<L> layouts = {{"grouped_tp2", 2, false, 1, 0, "alltoall", false},
                            {"grouped_tp2_sp_allgather", 2, true, 1, 0, "allgather", false},
                            {"grouped_ep2_alltoall_distopt", 1, false, 2, 0, "alltoall", true}};
  if (world()->size() == 4)
    layouts = {{"grouped_ep2_tp2_sp_alltoall_distopt", 2, true, 2, 0, "alltoall", true},
               {"grouped_tp2_sp_etp1_ep2_allgather", 2, true, 2, 1, "allgather", false},
               {"grouped_tp4", 4, false, 1, 0, "alltoall", false},
               {"grouped_ep4_alltoall", 1, false, 4, 0, "alltoall", false}};
  const TrainingSummary r = run_single(grouped_args(f, 8));
  for (const L& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs par = grouped_args(f, 8);
    par.parallel.tensor_model_parallel_size = l.tp;
    par.model.sequence_parallel = l.sp;
    par.parallel.expert_model_parallel_size = l.ep;
    par.parallel.expert_tensor_parallel_size = l.etp;
    par.model.moe_token_dispatcher_type = l.dispatcher;
    par.parallel.use_distributed_optimizer = l.dist_opt;
    expect_same_moe_curve(pretrain(par), r, l.name);
  }
}

// Saved at iteration 4 and resumed, a grouped run under EP2 (EP2 x TP2 with sequence parallelism
// on 4 ranks), with the distributed optimizer, equals the uninterrupted one bit for bit.
TEST(MpiMoeGrouped, ExpertParallelResumeIsBitExact) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = grouped_args(f, 8);
  a.parallel.expert_model_parallel_size = 2;
  a.parallel.use_distributed_optimizer = true;
  if (world()->size() == 4) {
    a.parallel.tensor_model_parallel_size = 2;
    a.model.sequence_parallel = true;
  }
  expect_exact_resume(a, f.dir / "full", f.dir / "resume",
                      [](const TrainingArgs& r) { return pretrain(r); }, 4);
}

}  // namespace
}  // namespace megatron::training
