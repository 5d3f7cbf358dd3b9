// Mixture-of-experts GPT training (model/moe/): the tiny GPT of parallel_test_util.h with MoE
// layers trains with a falling loss and logs Megatron's load_balancing_loss and z_loss; a run
// saved and resumed continues the uninterrupted curve bit for bit; the expert bias moves against
// the load; under mpirun (Mpi* tests) data parallelism with the distributed optimizer and tensor
// parallelism follow the single-rank curve and end with the same parameters, and so does expert
// parallelism (both dispatchers, with data and tensor parallelism). The MoE flags of
// pretrain-gpt refuse what is not built with errors naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "model/gpt_model.h"
#include "moe_test_util.h"
#include "training/metrics.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

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

// The expert bias is saved with the weights ("...router.expert_bias", float64) and restored: a
// run resumed with --moe-router-enable-expert-bias continues the uninterrupted curve bit for bit.
TEST(MoeTraining, ResumeWithTheExpertBiasIsBitExact) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  TrainingArgs a = moe_args(f, 10);
  a.model.moe_router_score_function = "sigmoid";
  a.model.moe_router_enable_expert_bias = true;
  a.model.moe_router_bias_update_rate = 0.05f;
  a.save = f.dir / "full";
  a.save_interval = 1000;
  const TrainingSummary full = run_single(a);
  TrainingArgs b = a;
  b.save = f.dir / "split";
  b.exit_interval = 5;
  run_single(b);
  // The saved bias has moved (an odd number of steps of +-rate from 0), so the resume below
  // depends on restoring it.
  const auto st = read_safetensors(fs::path(b.save) / "iter_0000005/mp_rank_00/model.safetensors");
  const Tensor& bias = st.tensors.at("decoder.layers.1.mlp.router.expert_bias");
  ASSERT_EQ(bias.dtype(), DType::F64);
  double moved = 0;
  for (int64_t e = 0; e < bias.numel(); ++e) moved += std::abs(bias.data<double>()[e]);
  EXPECT_GT(moved, 0.0);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = run_single(b);
  ASSERT_EQ(second.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(second.losses[i], full.losses[5 + i]) << "iteration " << i + 6;
  expect_same_params(b.save, a.save, 10, 0.0);
  const json meta = json::parse(testing::read_file(fs::path(a.save) / "iter_0000010/metadata.json"));
  EXPECT_TRUE(meta["weights"].contains("decoder.layers.1.mlp.router.expert_bias")) << meta["weights"].dump();
}

// Each load-balancing type trains and logs its loss under Megatron's name; sinkhorn logs none.
TEST(MoeTraining, EachLoadBalancingTypeLogsItsLoss) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  for (const std::string type : {"seq_aux_loss", "global_aux_loss", "sinkhorn"}) {
    SCOPED_TRACE(type);
    TrainingArgs a = moe_args(f, 4);
    a.model.moe_router_load_balancing_type = type;
    if (type == "sinkhorn") a.model.moe_aux_loss_coeff = 0;
    // two sequences per micro-batch (seq_aux_loss), four micro-batches (global_aux_loss)
    a.log_interval = 1;
    a.metrics_jsonl = f.dir / (type + ".jsonl");
    const TrainingSummary s = run_single(a);
    ASSERT_EQ(s.losses.size(), 4u);
    const std::string log = testing::read_file(a.metrics_jsonl);
    const json first = json::parse(log.substr(0, log.find('\n')));
    const std::string name = type == "seq_aux_loss" ? "seq_load_balancing_loss"
                             : type == "global_aux_loss" ? "global_load_balancing_loss" : "";
    for (const char* other : {"load_balancing_loss", "seq_load_balancing_loss",
                              "global_load_balancing_loss"})
      EXPECT_EQ(first.contains(other), name == other) << first.dump();
    ASSERT_TRUE(first.contains("z_loss")) << first.dump();
    if (!name.empty()) {  // E * sum_e f_e P_e: 1 balanced, at most E
      EXPECT_GT(first[name].get<double>(), 0.5);
      EXPECT_LT(first[name].get<double>(), 4.0);
    }
    for (double l : s.losses) EXPECT_TRUE(std::isfinite(l));
  }
}

// --moe-per-layer-logging writes Megatron's moe/<loss>_layer_<i> to TensorBoard for every layer
// (0 for the dense layer 0); their mean over the MoE layers is the logged value.
TEST(MoeTraining, PerLayerLoggingWritesEachLayersLosses) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  TrainingArgs a = moe_args(f, 4);
  a.model.num_layers = 3;
  a.model.moe_layer_freq = "[0,1,1]";
  a.moe_per_layer_logging = true;
  a.tensorboard.dir = f.dir / "tb";
  const TrainingSummary s = run_single(a);
  fs::path file;
  for (const auto& e : fs::directory_iterator(fs::path(a.tensorboard.dir))) file = e.path();
  const testing::CommandResult r = testing::run_command(
      "/usr/bin/python3 '" + (testing::source_dir() / "tests/reference/tfevents_reader.py").string() +
      "' '" + file.string() + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  std::map<std::string, double> at2;
  for (const json& v : j["scalars"])
    if (v["step"] == 2) at2[v["tag"].get<std::string>()] = v["value"].get<double>();
  for (const std::string n : {"load_balancing_loss", "z_loss"}) {
    ASSERT_TRUE(at2.count("moe/" + n + "_layer_0")) << r.output;
    EXPECT_EQ(at2["moe/" + n + "_layer_0"], 0.0);
    const double l1 = at2["moe/" + n + "_layer_1"], l2 = at2["moe/" + n + "_layer_2"];
    EXPECT_GT(l1, 0.0);
    EXPECT_GT(l2, 0.0);
    EXPECT_NEAR((l1 + l2) / 2, at2[n], 1e-6 * at2[n]) << n;  // float32 in the events
  }
  EXPECT_FALSE(at2.count("moe/load_balancing_loss_layer_3"));
  ASSERT_EQ(s.more_losses.size(), 4u);  // the log line keeps the two averages only
  EXPECT_EQ(s.more_losses.back().size(), 2u);
}

// --moe-grouped-gemm saves the experts under Megatron-Core's grouped names (one tensor per
// expert, its number recorded); a sequential run refuses that checkpoint naming the setting.
TEST(MoeTraining, GroupedGemmCheckpointsUseTheGroupedNames) {
  if (world()->size() > 1) GTEST_SKIP() << "a single-rank test";
  Fixture f;
  TrainingArgs a = moe_args(f, 4);
  a.model.moe_grouped_gemm = true;
  a.save = f.dir / "grouped";
  a.save_interval = 1000;
  const TrainingSummary s = run_single(a);
  EXPECT_LT(s.losses.back(), s.losses.front());
  const json meta = json::parse(testing::read_file(fs::path(a.save) / "iter_0000004/metadata.json"));
  EXPECT_EQ(meta["weights"]["decoder.layers.1.mlp.experts.linear_fc1.weight3"]["expert"], 3);
  EXPECT_EQ(meta["weights"]["decoder.layers.1.mlp.experts.linear_fc2.weight0"]["expert"], 0);
  EXPECT_FALSE(meta["weights"].contains("decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"));
  TrainingArgs b = moe_args(f, 6);
  b.load = a.save;
  try {
    run_single(b);
    ADD_FAILURE() << "a sequential run loaded a grouped checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_grouped_gemm"), std::string::npos) << e.what();
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
  // A single process cannot hold 2 expert-parallel ranks.
  EXPECT_NE(err("--expert-model-parallel-size 2").find("--expert-model-parallel-size (2)"),
            std::string::npos);
  EXPECT_NE(err("--expert-model-parallel-size 3").find("--num-experts 4 is not divisible by "
                                                         "--expert-model-parallel-size 3"),
            std::string::npos);
  EXPECT_NE(err("--expert-tensor-parallel-size 2").find("--expert-tensor-parallel-size (2)"),
            std::string::npos);
  EXPECT_NE(err("--expert-tensor-parallel-size 1 --tensor-model-parallel-size 2")
                .find("which needs --sequence-parallel"), std::string::npos);
  EXPECT_NE(err("--moe-router-topk 5").find("--moe-router-topk 5 must be in [1, --num-experts=4]"),
            std::string::npos);
  EXPECT_NE(err("--moe-router-num-groups 3 --moe-router-group-topk 1")
                .find("is not divisible by --moe-router-num-groups 3"), std::string::npos);
  EXPECT_NE(err("--moe-layer-freq '([1]*3+[0]'").find("--moe-layer-freq"), std::string::npos);
  EXPECT_NE(err("--moe-layer-freq '[1,0,1]'").find("gives 3 layers but --num-layers is 2"),
            std::string::npos);
  EXPECT_NE(err("--moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 0.01")
                .find("takes no auxiliary loss"), std::string::npos);
  EXPECT_NE(err("--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.1 0.1")
                .find("takes one type"), std::string::npos);
  EXPECT_NE(err("--moe-shared-expert-gate").find("--moe-shared-expert-intermediate-size"),
            std::string::npos);
  EXPECT_NE(err("--expert-model-parallel-size 2 --tensor-model-parallel-size 2")
                .find("sequence parallelism must be used"), std::string::npos);
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
