// Mixture-of-experts training under pipeline and context parallelism, by parity with the
// single-rank run (tests named Mpi* run under mpirun -np 2 / -np 4).
//  - Pipeline parallelism: the layers split over the stages by --moe-layer-freq's pattern (a stage
//    may hold no MoE layer), each stage's expert-parallel groups, the auxiliary losses' gradients
//    injected on every stage with the micro-batch's scale (MoEAuxLossAutoScaler), the logged MoE
//    losses summed over the stages and averaged over the model's MoE layers (track_moe_metrics),
//    and the expert bias updated per stage. PP2 (1F1B, the dense layer alone on stage 0), PP2
//    interleaved (4 layers, 1 per virtual stage, sigmoid routing with the expert bias), PP2 x EP2
//    (both dispatchers, the distributed optimizer), PP2 x TP2 + SP and PP2 x DP2 follow the
//    single-rank curve, MoE losses included, and end with its parameters; so does the 8-rank
//    EP2 x TP2 + SP x PP2 (x DP2) mesh with both dispatchers and the distributed optimizer.
//  - Context parallelism: every CP rank routes its slice of each sequence; the load-balancing
//    counts are summed over TP x CP (seq_aux_loss's per sequence: each rank holds a part of every
//    sequence), each rank's loss is its tokens' share, the z-loss coefficient is divided by
//    TP x CP, and the auxiliary gradient scale is multiplied by CP (forward_step_calc_loss's
//    cp_size_for_scaling). CP2 (aux_loss, seq_aux_loss with the shared-expert gate,
//    global_aux_loss), CP2 x EP2, CP2 x TP2 + SP and CP2 x DP2 follow the single-rank curve.
//  - Checkpoints of MoE under PP (mp_rank_TT_PPP[_EEE]): a run stopped and resumed continues the
//    uninterrupted curve bit for bit under PP2 and PP2 x EP2.
//  - The command line takes both: `mpirun -np 2 megatron pretrain-gpt` with PP2 or CP2 follows the
//    single-process run of the same flags.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "moe_test_util.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

struct Layout {
  std::string name;
  int tp = 1, pp = 1, cp = 1, ep = 1;
  const char* dispatcher = "alltoall";
  bool dist_opt = false;
  std::string model = "aux_loss";  // which of the models below
};

// The MoE models of these tests: moe_args' (2 layers, the second MoE) with the named
// load-balancing type; "interleaved" has 4 layers "[1,0,1,1]" routed by sigmoid scores with the
// expert bias; "gate" adds the shared expert's gate to seq_aux_loss.
TrainingArgs model_args(const Fixture& f, const std::string& model, int64_t iters) {
  TrainingArgs a = moe_args(f, iters);
  if (model == "interleaved") {
    a.model.num_layers = 4;
    a.model.moe_layer_freq = "[1,0,1,1]";
    a.model.moe_router_score_function = "sigmoid";
    a.model.moe_router_enable_expert_bias = true;
    a.model.moe_router_bias_update_rate = 0.01f;
  } else if (model == "gate") {
    a.model.moe_router_load_balancing_type = "seq_aux_loss";
    a.model.moe_shared_expert_gate = true;
  } else {
    a.model.moe_router_load_balancing_type = model;
  }
  return a;
}

TrainingArgs parallel_args(const Fixture& f, const Layout& l, int64_t iters) {
  TrainingArgs a = model_args(f, l.model, iters);
  a.parallel.tensor_model_parallel_size = l.tp;
  a.model.sequence_parallel = l.tp > 1;
  a.parallel.pipeline_model_parallel_size = l.pp;
  if (l.model == "interleaved") a.parallel.num_layers_per_virtual_pipeline_stage = 1;
  a.parallel.context_parallel_size = l.cp;
  a.parallel.expert_model_parallel_size = l.ep;
  a.model.moe_token_dispatcher_type = l.dispatcher;
  a.parallel.use_distributed_optimizer = l.dist_opt;
  return a;
}

// Each layout against the single-rank run of its model (rank 0 trains it once per model), the
// final parameters compared through the checkpoints.
void expect_layouts_follow_the_single_rank_curve(const Fixture& f, const std::vector<Layout>& layouts,
                                                 int64_t iters) {
  std::map<std::string, TrainingSummary> refs;
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    const std::string ref_save = f.dir / ("ref_" + l.model);
    if (!refs.count(l.model)) refs[l.model] = reference_curve(model_args(f, l.model, iters), ref_save);
    TrainingArgs par = parallel_args(f, l, iters);
    par.save = f.dir / ("par_" + l.name);
    par.save_interval = 1000;
    const TrainingSummary p = pretrain(par);
    expect_same_moe_curve(p, refs[l.model], l.name);
    if (world()->rank() == 0) expect_same_params(par.save, ref_save, iters, 1e-5);
    world()->barrier();
  }
}

TEST(MpiMoePipeline, PipelineStagesFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  std::vector<Layout> layouts = {{.name = "moe_pp2", .pp = 2},
                                 {.name = "moe_pp2_interleaved", .pp = 2, .model = "interleaved"}};
  if (world()->size() == 4)
    layouts = {{.name = "moe_pp2_ep2_alltoall_distopt", .pp = 2, .ep = 2, .dist_opt = true},
               {.name = "moe_pp2_ep2_allgather_interleaved", .pp = 2, .ep = 2,
                .dispatcher = "allgather", .model = "interleaved"},
               {.name = "moe_pp2_tp2_sp", .tp = 2, .pp = 2, .model = "seq_aux_loss"},
               {.name = "moe_pp2_dp2_distopt", .pp = 2, .dist_opt = true}};
  expect_layouts_follow_the_single_rank_curve(f, layouts, 10);
}

// The 8-rank mesh: TP2 + SP x PP2 x DP2 for attention, ETP2 x EP2 for the experts of each stage
// (expert data parallel 1), with both dispatchers, the distributed optimizer and the
// interleaved schedule with the expert bias. Runs at -np 8 alone.
TEST(MpiMoePipeline, EightRanksFollowTheSingleRankCurve) {
  if (world()->size() != 8) GTEST_SKIP() << "runs at np 8";
  Fixture f;
  expect_layouts_follow_the_single_rank_curve(
      f,
      {{.name = "moe_ep2_tp2_sp_pp2_alltoall", .tp = 2, .pp = 2, .ep = 2},
       {.name = "moe_ep2_tp2_sp_pp2_alltoall_distopt_interleaved", .tp = 2, .pp = 2, .ep = 2,
        .dist_opt = true, .model = "interleaved"},
       {.name = "moe_ep2_tp2_sp_pp2_allgather_seq_aux", .tp = 2, .pp = 2, .ep = 2,
        .dispatcher = "allgather", .model = "seq_aux_loss"}},
      6);
}

TEST(MpiMoePipeline, ContextParallelFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  std::vector<Layout> layouts = {{.name = "moe_cp2", .cp = 2},
                                 {.name = "moe_cp2_seq_aux_gate", .cp = 2, .model = "gate"},
                                 {.name = "moe_cp2_global", .cp = 2, .model = "global_aux_loss"}};
  if (world()->size() == 4)
    layouts = {{.name = "moe_cp2_ep2_alltoall_distopt", .cp = 2, .ep = 2, .dist_opt = true},
               {.name = "moe_cp2_ep2_allgather_seq_aux", .cp = 2, .ep = 2,
                .dispatcher = "allgather", .model = "seq_aux_loss"},
               {.name = "moe_cp2_tp2_sp_seq_aux", .tp = 2, .cp = 2, .model = "seq_aux_loss"},
               {.name = "moe_cp2_dp2", .cp = 2}};
  expect_layouts_follow_the_single_rank_curve(f, layouts, 10);
}

// Saved at iteration 5 and resumed: the losses and the final parameters of the uninterrupted run,
// bit for bit, with the expert bias (the interleaved model) restored on every stage.
TEST(MpiMoePipeline, PipelineCheckpointsResumeExactly) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const Layout l = world()->size() == 4
                       ? Layout{.name = "pp2_ep2", .pp = 2, .ep = 2, .model = "interleaved"}
                       : Layout{.name = "pp2", .pp = 2, .model = "interleaved"};
  expect_exact_resume(parallel_args(f, l, 10), f.dir / "full", f.dir / "resume",
                      [](const TrainingArgs& a) { return pretrain(a); }, 5);
}

#ifdef MEGATRON_HAVE_MPI
// `mpirun -np 2 megatron pretrain-gpt` with PP2 (and with CP2) against one process of the same
// flags: the logged losses of every iteration within 1e-5, the MoE losses included.
TEST(MoeCli, PipelineAndContextParallelFollowTheSingleProcessRun) {
  if (world()->size() > 1) GTEST_SKIP() << "launches mpirun itself";
  Fixture f;
  const std::string common = moe_cli_command(f, 4) +
                             "--moe-layer-freq '[1,1]' --moe-router-load-balancing-type seq_aux_loss ";
  const std::string one = f.dir / "one.jsonl";
  const testing::CommandResult single = testing::run_cli(common + "--log-metrics-jsonl " + one);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const std::vector<json> a = metrics_lines(one);
  ASSERT_EQ(a.size(), 4u);
  for (const std::string flags : {"--pipeline-model-parallel-size 2", "--context-parallel-size 2"}) {
    SCOPED_TRACE(flags);
    const std::string two = f.dir / (flags.substr(2, 4) + ".jsonl");  // metrics files append
    const testing::CommandResult par = testing::run_command(
        "OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np 2 " +
        testing::cli_path().string() + " " + common + flags + " --log-metrics-jsonl " + two);
    ASSERT_EQ(par.exit_code, 0) << par.output;
    const std::vector<json> b = metrics_lines(two);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i)
      for (const char* k : {"lm_loss", "seq_load_balancing_loss", "z_loss"}) {
        const double want = a[i].at(k).get<double>(), got = b[i].at(k).get<double>();
        EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << k << " at iteration " << i + 1;
      }
  }
}
#endif

}  // namespace
}  // namespace megatron::training
