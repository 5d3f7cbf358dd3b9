// The MoE layer (model/moe/) against the independent float64 PyTorch MoE of
// tests/reference/moe_reference.py on the same weights and inputs: the layer's output, the
// gradients of its input, router and every expert (and shared expert) weight, the logged
// load-balancing and z losses and the tokens per expert, for each routing setting and
// load-balancing type (over several micro-batches where global_aux_loss accumulates counts).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "kernels/ops.h"
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
  int micro_batches = 1;
  int64_t sequences = 1;
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
  const int M = cs.micro_batches;
  const std::vector<float> xv = normal(M * N * h, 900, 1.0f), gv = normal(M * N * h, 901, 1.0f);

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
                      {"aux_loss_coeff", c.moe_aux_loss_coeff},
                      {"balancing", c.moe_router_load_balancing_type},
                      {"micro_batches", M}, {"sequences", cs.sequences},
                      {"shared_gate", c.moe_shared_expert_gate},
                      {"z_loss_coeff", c.moe_z_loss_coeff},
                      {"expert_bias", !cs.expert_bias.empty()},
                      {"aux_grad_scale", cs.aux_grad_scale}};
  megatron::testing::write_file(dir.path() / "config.json", j.dump());
  const std::vector<double> ref = testing::run_reference_script("moe_reference.py", dir.path());

  LayerContext ctx;
  ctx.training = true;
  ctx.save = true;
  ctx.batch = cs.sequences;
  ctx.seq = N / cs.sequences;
  ctx.moe_aux_grad_scale = cs.aux_grad_scale;
  const Tensor x = Tensor::from_vector(xv, {M * N, h}), g = Tensor::from_vector(gv, {M * N, h});
  Tensor y = Tensor::empty({M * N, h}, DType::F32), dx = Tensor::empty({M * N, h}, DType::F32);
  for (int m = 0; m < M; ++m) {  // each micro-batch's forward and backward, as the schedule runs
    y.narrow(0, m * N, N).copy_(moe.forward(ctx, x.narrow(0, m * N, N).contiguous()));
    dx.narrow(0, m * N, N).copy_(moe.backward(ctx, g.narrow(0, m * N, N).contiguous()));
  }
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

TEST(MoeReference, SeqAuxLossPerSequence) {
  check({[](TransformerConfig& c) {
          c.moe_router_load_balancing_type = "seq_aux_loss";
          c.moe_aux_loss_coeff = 0.5f;
          c.moe_z_loss_coeff = 0.1f;
        },
        24, 0.7, {}, 1, 3});
}

TEST(MoeReference, SeqAuxLossSigmoidWithCapacity) {
  check({[](TransformerConfig& c) {
          c.moe_router_load_balancing_type = "seq_aux_loss";
          c.moe_router_score_function = "sigmoid";
          c.moe_aux_loss_coeff = 0.4f;
          c.moe_expert_capacity_factor = 1.0f;
        },
        24, 0.6, {}, 2, 2});
}

TEST(MoeReference, GlobalAuxLossAccumulatesOverMicroBatches) {
  check({[](TransformerConfig& c) {
          c.moe_router_load_balancing_type = "global_aux_loss";
          c.moe_aux_loss_coeff = 0.5f;
        },
        20, 0.7, {}, 3, 2});
}

TEST(MoeReference, SinkhornTop2) {
  check({[](TransformerConfig& c) {
          c.moe_router_load_balancing_type = "sinkhorn";
          c.moe_aux_loss_coeff = 0.0f;
          c.moe_z_loss_coeff = 0.2f;
        },
        24, 0.7, {}, 2});
}

TEST(MoeReference, SinkhornTop1WithCapacity) {
  check({[](TransformerConfig& c) {
    c.moe_router_load_balancing_type = "sinkhorn";
    c.moe_router_topk = 1;
    c.moe_expert_capacity_factor = 1.0f;
  }});
}

TEST(MoeReference, SharedExpertGate) {
  check({[](TransformerConfig& c) {
          c.activation = "swiglu";
          c.moe_shared_expert_intermediate_size = 20;
          c.moe_shared_expert_gate = true;
          c.moe_aux_loss_coeff = 0.3f;
        },
        24, 0.7, {}, 2});
}

TEST(MoeReference, GroupedGemmExperts) {
  check({[](TransformerConfig& c) {
          c.activation = "swiglu";
          c.moe_grouped_gemm = true;
          c.moe_aux_loss_coeff = 0.5f;
          c.moe_expert_capacity_factor = 0.75f;  // an expert may get no rows
        },
        24, 0.7, {}, 2});
}

// The grouped experts compute what the sequential ones do on the same weights (under their
// grouped names), bit for bit: the same products over the same rows, in fp32 and with bf16
// weights (both multiply bf16 activations rounded from the same fp32 values).
void expect_grouped_equals_sequential(DType dtype) {
  TransformerConfig c = moe_config();
  c.activation = "swiglu";
  c.moe_aux_loss_coeff = 0.1f;
  c.params_dtype = dtype;
  TransformerConfig g = c;
  g.moe_grouped_gemm = true;
  const MlpSpec spec{&activation_kind(c.activation)};
  MoELayer seq("decoder.layers.0.mlp", c, spec, 0), grp("decoder.layers.0.mlp", g, spec, 0);
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : grp.parameters()) by_name[p->name] = p;
  // ...experts.local_experts.<e>.linear_fc1.weight -> ...experts.linear_fc1.weight<e>
  auto grouped_name = [](std::string name) {
    const size_t at = name.find("local_experts.");
    if (at == std::string::npos) return name;
    const size_t dot = name.find('.', at + 14);
    return name.substr(0, at) + name.substr(dot + 1) + name.substr(at + 14, dot - at - 14);
  };
  uint64_t stream = 1;
  for (Parameter* p : seq.parameters()) {
    ops::cast(p->value, Tensor::from_vector(normal(p->value.numel(), stream++, 0.5f), p->value.shape()));
    const std::string name = grouped_name(p->name);
    ASSERT_TRUE(by_name.count(name)) << name;
    by_name[name]->value.copy_(p->value);
  }
  ASSERT_EQ(by_name.size(), seq.parameters().size());
  seq.refresh_working_weights();
  grp.refresh_working_weights();
  LayerContext ctx;
  ctx.training = ctx.save = true;
  ctx.batch = 1;
  ctx.seq = 32;
  const Tensor x = Tensor::from_vector(normal(32 * 16, 7, 1.0f), {32, 16});
  const Tensor dy = Tensor::from_vector(normal(32 * 16, 8, 1.0f), {32, 16});
  const Tensor ys = seq.forward(ctx, x), yg = grp.forward(ctx, x);
  const Tensor dxs = seq.backward(ctx, dy), dxg = grp.backward(ctx, dy);
  for (int64_t i = 0; i < ys.numel(); ++i) {
    ASSERT_EQ(ys.data<float>()[i], yg.data<float>()[i]) << i;
    ASSERT_EQ(dxs.data<float>()[i], dxg.data<float>()[i]) << i;
  }
  for (Parameter* p : seq.parameters()) {
    const std::string name = grouped_name(p->name);
    const Parameter* q = by_name[name];
    for (int64_t i = 0; i < p->grad.numel(); ++i)
      ASSERT_EQ(p->grad.data<float>()[i], q->grad.data<float>()[i]) << name << " " << i;
  }
}

TEST(MoeReference, GroupedGemmEqualsTheSequentialExperts) { expect_grouped_equals_sequential(DType::F32); }

TEST(MoeReference, GroupedGemmEqualsTheSequentialExpertsWithBf16Weights) {
  expect_grouped_equals_sequential(DType::BF16);
}

// Evaluation routes sinkhorn by the scores (no Sinkhorn normalisation) and computes no loss.
TEST(MoeReference, SinkhornEvaluationChoosesByTheScores) {
  RouterSettings s;
  s.num_experts = 2;
  s.topk = 1;
  s.balancing = LoadBalancing::sinkhorn;
  // Both tokens prefer expert 0; Sinkhorn's balanced plan gives token 1 to expert 1
  // ([[0.389, 0.111], [0.111, 0.389]]).
  const std::vector<double> logits = {3.0, 0.0, 1.0, 0.5};
  const Routing eval = route(logits, 2, s, {}, /*training=*/false);
  const Routing train = route(logits, 2, s, {}, /*training=*/true);
  EXPECT_EQ(eval.map, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(train.map, (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_NEAR(train.probs[3], 1.0 / (1.0 + std::exp(-0.5)), 1e-15);
}

}  // namespace
}  // namespace megatron::model
