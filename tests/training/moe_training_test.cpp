// Mixture-of-experts GPT training (model/moe/): the tiny GPT of parallel_test_util.h with MoE
// layers trains with a falling loss and logs Megatron's load_balancing_loss and z_loss; a run
// saved and resumed continues the uninterrupted curve bit for bit; the expert bias moves against
// the load; under mpirun (Mpi* tests) data parallelism with the distributed optimizer and tensor
// parallelism follow the single-rank curve and end with the same parameters, and so does expert
// parallelism (both dispatchers, with data and tensor parallelism). The MoE flags of
// pretrain-gpt refuse what is not built with errors naming the flag.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "parallel_test_util.h"
#include "training/metrics.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// 2 layers, the second an MoE layer of 4 SwiGLU experts (top-2, a shared expert), no biases.
TrainingArgs moe_args(const Fixture& f, int64_t iters = 20) {
  TrainingArgs a = f.args(iters);
  a.model.add_bias_linear = false;
  a.model.activation = "swiglu";
  a.model.ffn_hidden_size = 48;
  a.model.num_moe_experts = 4;
  a.model.moe_layer_freq = "[0,1]";
  a.model.moe_ffn_hidden_size = 24;
  a.model.moe_router_topk = 2;
  a.model.moe_shared_expert_intermediate_size = 16;
  a.model.moe_aux_loss_coeff = 0.01f;
  a.model.moe_z_loss_coeff = 0.001f;
  return a;
}

TEST(MoeTraining, TrainsWithFallingLossAndLogsTheAuxiliaryLosses) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  const TrainingSummary s = run_single(moe_args(f));
  ASSERT_EQ(s.losses.size(), 20u);
  EXPECT_LT(s.losses.back(), s.losses.front() - 0.3);
  ASSERT_EQ(s.more_losses.size(), 20u);
  for (const std::vector<double>& m : s.more_losses) {
    ASSERT_EQ(m.size(), 2u);  // load_balancing_loss, z_loss
    // E * sum_e f_e P_e: 1 for a balanced router, at most E (4) and at least ~0.5 here.
    EXPECT_GT(m[0], 0.5);
    EXPECT_LT(m[0], 4.0);
    EXPECT_GT(m[1], 0.0);  // logsumexp(logits)^2 >= 0, > 0 for 4 experts near uniform (ln 4)^2
  }
  EXPECT_NEAR(s.more_losses.front()[1], std::log(4.0) * std::log(4.0), 0.5);
}

TEST(MoeTraining, SaveAndResumeContinueTheSameCurve) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  TrainingArgs a = moe_args(f);
  a.save = f.dir / "full";
  a.save_interval = 1000;
  const TrainingSummary full = run_single(a);
  TrainingArgs b = a;
  b.save = f.dir / "split";
  b.exit_interval = 10;
  const TrainingSummary first = run_single(b);
  ASSERT_EQ(first.iterations, 10);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = run_single(b);
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "iteration " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[10 + i]) << "iteration " << i + 11;
  }
  expect_same_params(b.save, a.save, 20, 0.0);
  // The expert weights are saved with their expert number recorded.
  const json meta = json::parse(testing::read_file(fs::path(a.save) / "iter_0000020/metadata.json"));
  EXPECT_EQ(meta["weights"]["decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"]["expert"], 3);
  EXPECT_FALSE(meta["weights"]["decoder.layers.1.mlp.router.weight"].contains("expert"));
}

// The expert bias is not in checkpoints yet: loading one into a run that uses it is refused by
// name instead of restarting the bias at zero.
TEST(MoeTraining, LoadingWithTheExpertBiasIsRefused) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  TrainingArgs a = moe_args(f);
  a.model.moe_router_score_function = "sigmoid";
  a.model.moe_router_enable_expert_bias = true;
  a.save = f.dir / "bias";
  a.save_interval = 1000;
  a.exit_interval = 2;
  run_single(a);
  TrainingArgs b = a;
  b.load = a.save;
  b.exit_interval = 0;
  try {
    run_single(b);
    ADD_FAILURE() << "a run with the expert bias loaded a checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-router-enable-expert-bias"), std::string::npos)
        << e.what();
  }
}

TEST(MoeTraining, ExpertBiasMovesAgainstTheLoad) {
  model::TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.add_bias_linear = false;
  c.activation = "gelu";
  c.num_moe_experts = 4;
  c.moe_router_topk = 1;
  c.moe_router_score_function = "sigmoid";
  c.moe_router_enable_expert_bias = true;
  c.moe_router_bias_update_rate = 0.25f;
  model::MoELayer m("decoder.layers.0.mlp", c, {&model::activation_kind("gelu")}, 0);
  m.update_expert_bias({10, 2, 4, 4});  // mean 5
  EXPECT_EQ(m.expert_bias(), (std::vector<double>{-0.25, 0.25, 0.25, 0.25}));
  m.update_expert_bias({5, 5, 5, 5});  // balanced: sign(0) = 0
  EXPECT_EQ(m.expert_bias(), (std::vector<double>{-0.25, 0.25, 0.25, 0.25}));
}

// Megatron's num_floating_point_operations counts, per MoE layer, the top-k routed experts' and
// the shared expert's widths (no router term): a model whose MoE layers have topk * moe_ffn +
// shared = F counts as the dense model of width F.
TEST(MoeTraining, FlopsCountTheActiveExperts) {
  FlopsModel dense{4, 64, 4, 0, 0, 256, 32, 512, true};
  FlopsModel moe = dense;
  moe.num_moe_layers = 2;  // e.g. --moe-layer-freq 2
  moe.moe_ffn_hidden_size = 96;
  moe.moe_router_topk = 2;
  moe.moe_shared_expert_intermediate_size = 64;  // 2 * 96 + 64 = 256
  EXPECT_DOUBLE_EQ(flops_per_iteration(moe, 8), flops_per_iteration(dense, 8));
  moe.moe_router_topk = 1;  // 96 + 64 = 160: 96 fewer MLP columns in each of 2 layers
  const double mlp_per_column = 8.0 * 32 * 6 * 64 * 3;  // B s 6 h (x3 gated)
  EXPECT_DOUBLE_EQ(flops_per_iteration(moe, 8), flops_per_iteration(dense, 8) - 2 * 96 * mlp_per_column);
}

// The loss curve and the MoE losses of every iteration within 1e-5 of the single-rank run's.
void expect_same_moe_curve(const TrainingSummary& p, const TrainingSummary& r, const std::string& name) {
  expect_same_curve(p, r, 1e-5, name);
  ASSERT_EQ(p.more_losses.size(), r.more_losses.size());
  for (size_t i = 0; i < r.more_losses.size(); ++i)
    for (size_t k = 0; k < r.more_losses[i].size(); ++k)
      EXPECT_NEAR(p.more_losses[i][k], r.more_losses[i][k], 1e-5 * std::abs(r.more_losses[i][k]))
          << name << " iteration " << i + 1 << " MoE loss " << k;
}

TEST(MpiMoeTraining, DataAndTensorParallelFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  struct L { std::string name; int tp; bool dist_opt; };
  std::vector<L> layouts = {{"moe_dp_distopt", 1, true}, {"moe_tp2", 2, false}};
  for (const L& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs ref = moe_args(f), par = moe_args(f);
    ref.save = world()->rank() == 0 ? f.dir / ("ref_" + l.name) : "";
    ref.save_interval = 1000;
    par.save = f.dir / ("par_" + l.name);
    par.save_interval = 1000;
    par.parallel.tensor_model_parallel_size = l.tp;
    par.parallel.use_distributed_optimizer = l.dist_opt;
    const TrainingSummary r = run_single(ref);
    const TrainingSummary p = pretrain(par);
    expect_same_moe_curve(p, r, l.name);
    if (world()->rank() == 0) expect_same_params(par.save, ref.save, 20, 1e-5);
    world()->barrier();
  }
}

// Expert parallelism: the experts spread over 2 or 4 ranks (tokens moved by all-to-all or
// all-gather), beside tensor and data parallelism, with the plain or the distributed optimizer,
// follow the single-rank curve, MoE losses included. With 4 experts and EP 4 each rank holds one expert.
TEST(MpiMoeTraining, ExpertParallelFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  struct L { std::string name; int tp, ep; const char* dispatcher; bool dist_opt; };
  std::vector<L> layouts = {{"moe_ep2_alltoall", 1, 2, "alltoall", false},
                            {"moe_ep2_allgather_distopt", 1, 2, "allgather", true}};
  if (world()->size() == 4)
    layouts = {{"moe_ep2_tp2_alltoall", 2, 2, "alltoall", false},
               {"moe_ep2_tp2_allgather", 2, 2, "allgather", false},
               {"moe_ep2_dp2_alltoall_distopt", 1, 2, "alltoall", true},
               {"moe_ep4_alltoall", 1, 4, "alltoall", false}};
  TrainingArgs ref = moe_args(f, 10);
  const TrainingSummary r = run_single(ref);
  for (const L& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs par = moe_args(f, 10);
    par.parallel.tensor_model_parallel_size = l.tp;
    par.parallel.expert_model_parallel_size = l.ep;
    par.model.moe_token_dispatcher_type = l.dispatcher;
    par.parallel.use_distributed_optimizer = l.dist_opt;
    const TrainingSummary p = pretrain(par);
    expect_same_moe_curve(p, r, l.name);
  }
}

TEST(MoeCli, FlagsThatAreNotBuiltAreClearErrors) {
  const std::string base = "pretrain-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
                           "--seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 "
                           "--train-iters 1 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer "
                           "--vocab-size 4096 --disable-bias-linear --num-experts 4 ";
  auto err = [&](const std::string& flags) {
    const testing::CommandResult r = testing::run_cli(base + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    return r.output;
  };
  // A single process cannot hold 2 expert-parallel ranks; checkpoints under expert parallelism
  // are not built yet.
  EXPECT_NE(err("--expert-model-parallel-size 2").find("--expert-model-parallel-size (2)"),
            std::string::npos);
  EXPECT_NE(err("--expert-model-parallel-size 3").find("--num-experts 4 is not divisible by "
                                                         "--expert-model-parallel-size 3"),
            std::string::npos);
  EXPECT_NE(err("--expert-model-parallel-size 2 --save /tmp/x").find("--save/--load with"),
            std::string::npos);
  EXPECT_NE(err("--expert-tensor-parallel-size 2").find("--expert-tensor-parallel-size 2 differs"),
            std::string::npos);
  EXPECT_NE(err("--moe-router-topk 5").find("--moe-router-topk 5 must be in [1, --num-experts=4]"),
            std::string::npos);
  EXPECT_NE(err("--moe-router-num-groups 3 --moe-router-group-topk 1")
                .find("is not divisible by --moe-router-num-groups 3"), std::string::npos);
  EXPECT_NE(err("--moe-layer-freq '([1]*3+[0]'").find("--moe-layer-freq"), std::string::npos);
  EXPECT_NE(err("--moe-layer-freq '[1,0,1]'").find("gives 3 layers but --num-layers is 2"),
            std::string::npos);
  EXPECT_NE(err("--moe-router-load-balancing-type sinkhorn").find("not built yet"),
            std::string::npos);
  EXPECT_NE(err("--moe-grouped-gemm").find("--moe-grouped-gemm"), std::string::npos);
  EXPECT_NE(err("--moe-token-dispatcher-type flex").find("flex"), std::string::npos);
  EXPECT_NE(err("--moe-router-enable-expert-bias").find("sigmoid"), std::string::npos);
  const testing::CommandResult bias = testing::run_cli(
      "pretrain-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
      "--max-position-embeddings 16 --micro-batch-size 1 --train-iters 1 --lr 1e-3 --mock-data "
      "--tokenizer-type NullTokenizer --vocab-size 4096 --num-experts 4");
  EXPECT_NE(bias.output.find("--disable-bias-linear"), std::string::npos) << bias.output;
}

}  // namespace
}  // namespace megatron::training
