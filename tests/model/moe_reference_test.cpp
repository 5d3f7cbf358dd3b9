// The MoE layer (model/moe/) against the independent float64 PyTorch MoE of
// tests/reference/moe_reference.py on the same weights and inputs: the layer's output, the
// gradients of its input, router and every expert (and shared expert) weight, the logged
// load-balancing and z losses and the tokens per expert, for each routing setting.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "model/moe/moe_layer.h"
#include "model/moe/moe_pattern.h"
#include "model_test_util.h"

namespace megatron::model {
namespace {

using testing::append;
using testing::expect_close_to_reference;

TransformerConfig moe_config() {
  TransformerConfig c = testing::tiny_config();
  c.num_layers = 1;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.add_bias_linear = false;
  c.activation = "gelu";
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 12;
  c.moe_router_topk = 2;
  return c;
}

struct Case {
  std::function<void(TransformerConfig&)> set;
  int64_t tokens = 24;
  double aux_grad_scale = 0.7;
  std::vector<double> expert_bias = {};
};

std::vector<float> normal(int64_t n, uint64_t stream, float std) {
  std::vector<float> v(static_cast<size_t>(n));
  Philox(4242, stream).fill_normal(v.data(), n, 0.0f, std);
  return v;
}

void set_value(Parameter& p, const std::vector<float>& v) {
  ASSERT_EQ(int64_t(v.size()), p.value.numel()) << p.name;
  std::copy(v.begin(), v.end(), p.value.data<float>());
}

// Runs the case through the layer and the reference and compares everything.
void check(const Case& cs) {
  TransformerConfig c = moe_config();
  cs.set(c);
  c.validate_moe();
  MlpSpec spec{&activation_kind(c.activation)};
  MoELayer moe("decoder.layers.0.mlp", c, spec, 0);
  const int64_t N = cs.tokens, h = c.hidden_size;
  const int E = c.num_moe_experts;
  if (!cs.expert_bias.empty()) moe.set_expert_bias(cs.expert_bias);
  // Weights: the router's wider than the experts' so the routing is far from ties.
  uint64_t stream = 1;
  for (Parameter* p : moe.parameters())
    set_value(*p, normal(p->value.numel(), stream++, p->name.find("router") != std::string::npos
                                                         ? 0.6f : 0.3f));
  moe.refresh_working_weights();
  const std::vector<float> xv = normal(N * h, 900, 1.0f), gv = normal(N * h, 901, 1.0f);

  megatron::testing::TempDir dir;
  std::ofstream in(dir.path() / "in.bin", std::ios::binary);
  auto put = [&](const std::vector<float>& v) {
    const std::vector<double> d(v.begin(), v.end());
    append(in, d.data(), int64_t(d.size()));
  };
  put(xv);
  put(gv);
  for (Parameter* p : moe.parameters())
    put(std::vector<float>(p->value.data<float>(), p->value.data<float>() + p->value.numel()));
  if (!cs.expert_bias.empty()) append(in, cs.expert_bias.data(), E);
  in.close();
  nlohmann::json j = {{"tokens", N}, {"hidden", h}, {"experts", E}, {"topk", c.moe_router_topk},
                      {"ffn", c.moe_ffn()}, {"shared_ffn", c.moe_shared_expert_intermediate_size},
                      {"activation", c.activation},
                      {"score_function", c.moe_router_score_function},
                      {"pre_softmax", c.moe_router_pre_softmax},
                      {"scaling_factor", c.moe_router_topk_scaling_factor},
                      {"num_groups", c.moe_router_num_groups},
                      {"group_topk", c.moe_router_group_topk},
                      {"capacity_factor", c.moe_expert_capacity_factor},
                      {"drop_policy", c.moe_token_drop_policy},
                      {"pad_to_capacity", c.moe_pad_expert_input_to_capacity},
                      {"aux_loss_coeff", c.moe_router_load_balancing_type == "aux_loss"
                                             ? c.moe_aux_loss_coeff : 0.0f},
                      {"z_loss_coeff", c.moe_z_loss_coeff},
                      {"expert_bias", !cs.expert_bias.empty()},
                      {"aux_grad_scale", cs.aux_grad_scale}};
  megatron::testing::write_file(dir.path() / "config.json", j.dump());
  const std::vector<double> ref = testing::run_reference_script("moe_reference.py", dir.path());

  LayerContext ctx;
  ctx.training = true;
  ctx.save = true;
  ctx.batch = 1;
  ctx.seq = N;
  ctx.moe_aux_grad_scale = cs.aux_grad_scale;
  const Tensor x = Tensor::from_vector(xv, {N, h});
  const Tensor y = moe.forward(ctx, x);
  const Tensor dx = moe.backward(ctx, Tensor::from_vector(gv, {N, h}));
  const MoeStatistics st = moe.take_statistics();

  size_t at = 0;
  auto next = [&](const std::string& what, const Tensor& got) {
    ASSERT_LE(at + size_t(got.numel()), ref.size()) << what << ": the reference wrote too little";
    expect_close_to_reference(what, got.data<float>(), ref.data() + at, got.numel(), 1e-5);
    at += size_t(got.numel());
  };
  next("output", y);
  next("d input", dx);
  for (Parameter* p : moe.parameters()) next("d " + p->name, p->grad);
  ASSERT_EQ(ref.size(), at + 2 + size_t(E));
  EXPECT_NEAR(st.load_balancing_loss, ref[at], 1e-6 * std::max(1.0, std::abs(ref[at])));
  EXPECT_NEAR(st.z_loss, ref[at + 1], 1e-5 * std::max(1.0, std::abs(ref[at + 1])));
  for (int e = 0; e < E; ++e)
    EXPECT_EQ(st.tokens_per_expert[size_t(e)], ref[at + 2 + size_t(e)]) << "expert " << e;
}

TEST(MoeReference, SoftmaxTop2AuxLossAndZLoss) {
  check({[](TransformerConfig& c) {
    c.moe_aux_loss_coeff = 0.5f;
    c.moe_z_loss_coeff = 0.2f;
  }});
}

TEST(MoeReference, SoftmaxTop1) {
  check({[](TransformerConfig& c) {
    c.moe_router_topk = 1;
    c.moe_aux_loss_coeff = 0.1f;
  }});
}

TEST(MoeReference, SoftmaxPreSoftmaxWithScaling) {
  check({[](TransformerConfig& c) {
    c.moe_router_pre_softmax = true;
    c.moe_router_topk_scaling_factor = 2.5f;
    c.moe_aux_loss_coeff = 0.05f;
  }});
}

TEST(MoeReference, SigmoidTop2AuxLoss) {
  check({[](TransformerConfig& c) {
    c.moe_router_score_function = "sigmoid";
    c.moe_aux_loss_coeff = 0.6f;
    c.moe_z_loss_coeff = 0.3f;
  }});
}

TEST(MoeReference, SigmoidTop1) {
  check({[](TransformerConfig& c) {
    c.moe_router_score_function = "sigmoid";
    c.moe_router_topk = 1;
  }});
}

TEST(MoeReference, SigmoidWithExpertBias) {
  check({[](TransformerConfig& c) {
          c.moe_router_score_function = "sigmoid";
          c.moe_router_enable_expert_bias = true;
          c.moe_router_load_balancing_type = "none";
        },
        24, 1.0, {0.3, -0.2, 0.05, -0.4}});
}

TEST(MoeReference, GroupLimitedRouting) {
  check({[](TransformerConfig& c) {
    c.num_moe_experts = 8;
    c.moe_router_topk = 4;
    c.moe_router_num_groups = 4;
    c.moe_router_group_topk = 2;
    c.moe_router_score_function = "sigmoid";
    c.moe_aux_loss_coeff = 0.5f;
  }});
}

TEST(MoeReference, GroupLimitedSoftmax) {
  check({[](TransformerConfig& c) {
    c.num_moe_experts = 8;
    c.moe_router_topk = 2;
    c.moe_router_num_groups = 4;
    c.moe_router_group_topk = 1;
    c.moe_router_pre_softmax = true;
  }});
}

TEST(MoeReference, CapacityDropByProbs) {
  check({[](TransformerConfig& c) {
    c.moe_expert_capacity_factor = 0.75f;
    c.moe_aux_loss_coeff = 0.5f;
  }});
}

TEST(MoeReference, CapacityDropByPosition) {
  check({[](TransformerConfig& c) {
    c.moe_expert_capacity_factor = 0.75f;
    c.moe_token_drop_policy = "position";
  }});
}

TEST(MoeReference, CapacityPaddedToCapacity) {
  check({[](TransformerConfig& c) {
    c.moe_expert_capacity_factor = 1.0f;
    c.moe_pad_expert_input_to_capacity = true;
  }});
}

TEST(MoeReference, SwigluExpertsWithSharedExpert) {
  check({[](TransformerConfig& c) {
    c.activation = "swiglu";
    c.moe_shared_expert_intermediate_size = 20;
    c.moe_aux_loss_coeff = 0.5f;
  }});
}

}  // namespace
}  // namespace megatron::model
