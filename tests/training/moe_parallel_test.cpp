// Mixture-of-experts training under sequence parallelism, and global_aux_loss over data-parallel
// ranks, by parity with the single-rank run (tests named Mpi* run under mpirun -np 2 / -np 4).
//  - --sequence-parallel: each tensor-parallel rank routes its row block, the dispatchers gather
//    the rows of the tensor x expert group for the experts (which hold their TP shards and
//    communicate nothing themselves), and the load-balancing counts are summed over the group.
//    TP2 (both dispatchers), TP4 with seq_aux_loss (sequences split across ranks), TP2 x DP2 and
//    EP2 x TP2 (both dispatchers, the distributed optimizer in some) follow the single-rank
//    curve, MoE losses included, and where checkpoints exist (EP 1) end with its parameters.
//  - --expert-tensor-parallel-size other than the tensor-parallel size (Megatron's parallel
//    folding): the experts sharded over their own expert tensor-parallel group (or whole), the
//    dispatchers gathering over it, their gradients summed over the expert data-parallel group:
//    TP2 + SP with ETP1 (EP1 and EP2, both dispatchers, the distributed optimizer) and TP1 with
//    ETP2 follow the single-rank curve.
//  - The command line reaches EP2 x TP2 + SP: `mpirun -np 4 megatron pretrain-gpt` follows the
//    single-process run of the same flags.
//  - global_aux_loss (Megatron's _apply_global_aux_loss): the token counts are summed over the
//    tensor x data-parallel ranks and the loss uses their tokens, T = tokens x TP x DP; each
//    rank's loss is its tokens' share of the loss over all of them, and the gradients are
//    averaged over DP as usual. A DP2 run with coefficient c therefore trains as the single-rank
//    run of the same global batch in one micro-batch with coefficient c / 2, and logs the same
//    global_load_balancing_loss (the shares summed); counts taken per rank (as aux_loss takes
//    them) would log a visibly different number.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "moe_test_util.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

struct SpLayout {
  std::string name;
  int tp, ep;
  const char* dispatcher;
  bool dist_opt;
  std::string balancing = "aux_loss";
  bool gate = false;  // --moe-shared-expert-gate
};

TrainingArgs sp_model(const Fixture& f, const SpLayout& l) {
  TrainingArgs a = moe_args(f, 8);
  a.model.moe_router_load_balancing_type = l.balancing;
  a.model.moe_shared_expert_gate = l.gate;
  a.model.moe_token_dispatcher_type = l.dispatcher;
  return a;
}

TEST(MpiMoeTraining, SequenceParallelFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  std::vector<SpLayout> layouts = {{"moe_tp2_sp_alltoall", 2, 1, "alltoall", false},
                                   {"moe_tp2_sp_allgather_gate", 2, 1, "allgather", false,
                                    "seq_aux_loss", true}};
  if (world()->size() == 4)
    layouts = {{"moe_ep2_tp2_sp_alltoall_distopt", 2, 2, "alltoall", true},
               {"moe_ep2_tp2_sp_allgather", 2, 2, "allgather", false, "aux_loss", true},
               {"moe_tp2_sp_dp2_allgather_distopt", 2, 1, "allgather", true},
               {"moe_tp4_sp_alltoall_seq_aux", 4, 1, "alltoall", false, "seq_aux_loss"}};
  std::map<std::string, TrainingSummary> refs;  // by model (balancing, gate)
  for (const SpLayout& l : layouts) {
    SCOPED_TRACE(l.name);
    const std::string model = l.balancing + (l.gate ? "_gate" : "");
    TrainingArgs ref = sp_model(f, l), par = sp_model(f, l);
    ref.save = world()->rank() == 0 ? f.dir / ("ref_" + model) : "";
    ref.save_interval = 1000;
    if (!refs.count(model)) refs[model] = run_single(ref);
    par.parallel.tensor_model_parallel_size = l.tp;
    par.model.sequence_parallel = true;
    par.parallel.expert_model_parallel_size = l.ep;
    par.parallel.use_distributed_optimizer = l.dist_opt;
    if (l.ep == 1) {  // checkpoints of expert-parallel ranks are another part's work
      par.save = f.dir / ("par_" + l.name);
      par.save_interval = 1000;
    }
    const TrainingSummary p = pretrain(par);
    expect_same_moe_curve(p, refs[model], l.name);
    if (l.ep == 1 && world()->rank() == 0) expect_same_params(par.save, ref.save, 8, 1e-5);
    world()->barrier();
  }
}

TEST(MpiMoeTraining, ExpertTensorParallelOfItsOwnFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  struct L { std::string name; int tp, etp, ep; const char* dispatcher; bool dist_opt; };
  std::vector<L> layouts = {{"moe_tp2_sp_etp1_alltoall", 2, 1, 1, "alltoall", false},
                            {"moe_tp1_etp2_allgather", 1, 2, 1, "allgather", true}};
  if (world()->size() == 4)
    layouts = {{"moe_tp2_sp_etp1_ep2_alltoall_distopt", 2, 1, 2, "alltoall", true},
               {"moe_tp2_sp_etp1_ep2_allgather", 2, 1, 2, "allgather", false},
               {"moe_tp4_sp_etp2_alltoall", 4, 2, 1, "alltoall", false}};
  const TrainingSummary r = run_single(moe_args(f, 8));
  for (const L& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs par = moe_args(f, 8);
    par.parallel.tensor_model_parallel_size = l.tp;
    par.model.sequence_parallel = l.tp > 1;
    par.parallel.expert_tensor_parallel_size = l.etp;
    par.parallel.expert_model_parallel_size = l.ep;
    par.model.moe_token_dispatcher_type = l.dispatcher;
    par.parallel.use_distributed_optimizer = l.dist_opt;
    expect_same_moe_curve(pretrain(par), r, l.name);
  }
}

// One micro-batch per DP rank against the single-rank run of the whole global batch: see the
// file comment. Under mpirun -np 4 the DP2 ranks are also TP2 + SP (the counts summed over
// TP x DP).
TEST(MpiMoeTraining, GlobalAuxLossSumsTheCountsOverTheDataParallelRanks) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int tp = world()->size() == 4 ? 2 : 1, dp = world()->size() / tp;
  auto args = [&](const std::string& type, float coeff) {
    TrainingArgs a = moe_args(f, 6);
    a.model.moe_router_load_balancing_type = type;
    a.model.moe_aux_loss_coeff = coeff;
    a.global_batch_size = 2 * dp;
    a.model.init_method_std = 0.1f;  // a router far from uniform: the ranks' counts differ
    return a;
  };
  TrainingArgs ref = args("global_aux_loss", 0.02f / float(dp));
  ref.micro_batch_size = 2 * dp;  // the global batch in one micro-batch
  const TrainingSummary r = run_single(ref);
  TrainingArgs par = args("global_aux_loss", 0.02f);
  par.parallel.tensor_model_parallel_size = tp;
  par.model.sequence_parallel = tp > 1;
  const TrainingSummary p = pretrain(par);
  expect_same_moe_curve(p, r, "global_aux_loss");
  // Per-rank counts (aux_loss's, at the same initial weights): another number at iteration 1.
  TrainingArgs local = args("aux_loss", 0.02f);
  local.parallel.tensor_model_parallel_size = tp;
  local.model.sequence_parallel = tp > 1;
  local.train_iters = 1;
  local.lr_warmup_iters = 0;  // the first iteration's loss does not depend on the schedule
  const TrainingSummary l = pretrain(local);
  ASSERT_FALSE(l.more_losses.empty());
  const double global = p.more_losses[0][0], per_rank = l.more_losses[0][0];
  EXPECT_GT(std::abs(per_rank - global), 1e-3 * global)
      << "global " << global << " per-rank " << per_rank;
}

#ifdef MEGATRON_HAVE_MPI
// `mpirun -np 4 megatron pretrain-gpt` with EP2 x TP2 + SP against one process of the same
// flags: the logged losses of every iteration within 1e-5.
TEST(MoeCli, ExpertAndTensorParallelWithSequenceParallelFollowTheSingleProcessRun) {
  if (world()->size() > 1) GTEST_SKIP() << "launches mpirun itself";
  Fixture f;
  const std::string common = moe_cli_command(f, 5) +
                             "--moe-layer-freq '[0,1]' --moe-shared-expert-intermediate-size 16 "
                             "--moe-token-dispatcher-type alltoall ";
  const std::string one = f.dir / "one.jsonl", four = f.dir / "four.jsonl";
  const testing::CommandResult single =
      testing::run_cli(common + "--log-metrics-jsonl " + one);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const testing::CommandResult par = testing::run_command(
      "OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np 4 " +
      testing::cli_path().string() + " " + common +
      "--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 "
      "--use-distributed-optimizer --log-metrics-jsonl " + four);
  ASSERT_EQ(par.exit_code, 0) << par.output;
  EXPECT_NE(par.output.find("TP 2 x PP 1 x CP 1 x DP 2"), std::string::npos) << par.output;
  const std::vector<json> a = metrics_lines(one), b = metrics_lines(four);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"lm_loss", "load_balancing_loss", "z_loss"}) {
      const double want = a[i].at(k).get<double>(), got = b[i].at(k).get<double>();
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << k << " at iteration " << i + 1;
    }
}
#endif

}  // namespace
}  // namespace megatron::training
