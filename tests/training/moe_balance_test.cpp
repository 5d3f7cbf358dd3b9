// A tiny Mixtral-shaped model (Llama style, every layer 8 SwiGLU experts, top-2 softmax routing)
// learns, and the load-balancing loss keeps its experts balanced, as the demo
// (scripts/demo-moe.sh) shows at its scale; read from the --log-metrics-jsonl records:
//  - the loss of the last logged interval is well below the first's;
//  - each layer's "moe_expert_token_shares" sum to 1, and over the last interval every expert's
//    share is within a factor 2 of 1/8 with the aux loss (coefficient 0.1), and closer to it
//    than without;
//  - the shares are the router's counts: with every token's logits forced to be random
//    (--moe-router-force-load-balancing), every expert gets about 1/8;
//  - under pipeline (PP2, and PP2 x EP2 at -np 4) the shares of every layer, each on its own stage,
//    equal the single-rank run's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "model/model_test_util.h"
#include "moe_test_util.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;
constexpr int kExperts = 8;

TrainingArgs mixtral_shaped(const Fixture& f, int64_t iters) {
  TrainingArgs a = f.args(iters);
  model::testing::make_llama_style(a.model);
  a.model.num_layers = 2;
  a.model.num_moe_experts = kExperts;
  a.model.moe_ffn_hidden_size = 16;
  a.model.moe_router_topk = 2;
  a.model.moe_aux_loss_coeff = 0.01f;
  a.model.moe_z_loss_coeff = 0.001f;
  a.eval_interval = 1000;
  a.log_interval = 10;
  return a;
}

// Each logged interval's MoE layers' shares (layer -> E shares).
std::vector<std::map<int, std::vector<double>>> shares_of(const std::vector<json>& lines) {
  std::vector<std::map<int, std::vector<double>>> out;
  for (const json& l : lines) {
    std::map<int, std::vector<double>> m;
    EXPECT_TRUE(l.contains("moe_expert_token_shares")) << l.dump();
    if (l.contains("moe_expert_token_shares"))
      for (const auto& [layer, s] : l["moe_expert_token_shares"].items())
        m[std::stoi(layer)] = s.get<std::vector<double>>();
    out.push_back(m);
  }
  return out;
}

void expect_shares_near_uniform(const std::map<int, std::vector<double>>& shares, double factor,
                                const std::string& what) {
  ASSERT_EQ(shares.size(), 2u) << what;  // both layers are MoE layers
  for (const auto& [layer, s] : shares) {
    ASSERT_EQ(s.size(), size_t(kExperts)) << what;
    double sum = 0;
    for (double v : s) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-12) << what << " layer " << layer;
    for (size_t e = 0; e < s.size(); ++e) {
      EXPECT_GT(s[e], 1.0 / kExperts / factor) << what << " layer " << layer << " expert " << e;
      EXPECT_LT(s[e], 1.0 / kExperts * factor) << what << " layer " << layer << " expert " << e;
    }
  }
}

// The largest over the smallest share of any expert in any layer.
double spread(const std::map<int, std::vector<double>>& shares) {
  double lo = 1, hi = 0;
  for (const auto& [layer, s] : shares)
    for (double v : s) lo = std::min(lo, v), hi = std::max(hi, v);
  return hi / lo;
}

TEST(MoeBalance, MixtralShapedModelLearnsWithBalancedExperts) {
  Fixture f;
  std::map<float, std::map<int, std::vector<double>>> last_shares;
  for (const float coeff : {0.1f, 0.0f}) {
    SCOPED_TRACE(str("--moe-aux-loss-coeff ", coeff));
    TrainingArgs a = mixtral_shaped(f, 60);
    a.model.moe_aux_loss_coeff = coeff;
    a.metrics_jsonl = f.dir / str("metrics_", coeff, ".jsonl");
    run_single(a);
    const std::vector<json> lines = metrics_lines(a.metrics_jsonl);
    ASSERT_EQ(lines.size(), 6u);
    const double first = lines.front()["lm_loss"].get<double>(), last = lines.back()["lm_loss"].get<double>();
    EXPECT_LT(last, first - 1.0) << "the loss of iterations 51-60 against 1-10";
    last_shares[coeff] = shares_of(lines).back();
  }
  expect_shares_near_uniform(last_shares[0.1f], 2.0, "aux_loss 0.1, iterations 51-60");
  // Without the load-balancing loss the same run's experts drift apart further.
  std::printf("largest / smallest expert share, iterations 51-60: %.2f with the aux loss, %.2f without\n",
              spread(last_shares[0.1f]), spread(last_shares[0.0f]));
  EXPECT_LT(spread(last_shares[0.1f]), spread(last_shares[0.0f]));
}

TEST(MoeBalance, SharesAreTheRoutersCounts) {
  Fixture f;
  TrainingArgs a = mixtral_shaped(f, 10);
  a.model.moe_router_force_load_balancing = true;
  a.metrics_jsonl = f.dir / "metrics.jsonl";
  run_single(a);
  const std::vector<json> lines = metrics_lines(a.metrics_jsonl);
  ASSERT_EQ(lines.size(), 1u);
  // 10 iterations x 8 sequences x 16 tokens x top-2 = 2560 choices of 8 experts: about 320 each.
  expect_shares_near_uniform(shares_of(lines).back(), 1.3, "random routing");
}

TEST(MpiMoeBalance, PipelineStagesLogEveryLayersShares) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = mixtral_shaped(f, 10);
  a.log_interval = 5;
  std::vector<std::map<int, std::vector<double>>> ref;
  std::string text;
  if (world()->rank() == 0) {
    a.metrics_jsonl = f.dir / "one.jsonl";
    run_single(a);
    text = metrics_lines(a.metrics_jsonl).back().dump();
  }
  const json one = json::parse(all_gather_strings(*world(), text)[0]);
  a.parallel.pipeline_model_parallel_size = 2;
  a.parallel.expert_model_parallel_size = world()->size() / 2;
  a.model.moe_token_dispatcher_type = "alltoall";
  a.metrics_jsonl = f.dir / "par.jsonl";
  pretrain(a);
  if (world()->rank() == world()->size() - 1) {  // the last rank logs
    const auto got = shares_of(metrics_lines(a.metrics_jsonl)).back(), want = shares_of({one}).back();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [layer, s] : want)
      for (size_t e = 0; e < s.size(); ++e)
        EXPECT_NEAR(got.at(layer)[e], s[e], 1e-12) << "layer " << layer << " expert " << e;
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
