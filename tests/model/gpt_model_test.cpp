// GPTModel behaviour: recomputation (selective, full uniform/block) gives the same gradients as
// storing everything while saving activation memory; dropout masks are a pure function of
// (seed, dropout_offset); eval loss matches the training loss without dropout; bf16/fp16 params
// compute exactly like fp32 parameters holding the same values; parameter names and init.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/gpt_model.h"
#include "model_test_util.h"

namespace megatron::model {
namespace {

struct RunResult {
  LossResult loss;
  std::vector<std::vector<float>> grads;
  size_t activation_bytes;
};

RunResult run(const TransformerConfig& cfg, const Batch& in, uint64_t offset) {
  GPTModel m(cfg, 42);
  testing::randomise(m, 3);
  testing::zero_grads(m);
  RunResult r;
  r.loss = m.forward_backward(in, 0.5f, offset);
  for (Parameter* p : m.parameters()) r.grads.push_back(p->grad.to_float_vector());
  r.activation_bytes = m.activation_bytes();
  return r;
}

double max_rel_diff(const RunResult& a, const RunResult& b) {
  double worst = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    double scale = 1e-30;
    for (float v : a.grads[i]) scale = std::max(scale, double(std::abs(v)));
    for (size_t j = 0; j < a.grads[i].size(); ++j)
      worst = std::max(worst, std::abs(double(a.grads[i][j]) - b.grads[i][j]) / scale);
  }
  return worst;
}

TransformerConfig dropout_config() {
  TransformerConfig c = testing::tiny_config();
  c.num_layers = 4;
  c.hidden_dropout = 0.1f;
  c.attention_dropout = 0.1f;
  return c;
}

TEST(GPTModel, RecomputeGivesSameGradientsAndSavesMemory) {
  const TransformerConfig base = dropout_config();
  Batch in = testing::random_inputs(2, base.seq_length, base.padded_vocab_size, 11, true);
  const RunResult ref = run(base, in, 7);
  struct Case {
    const char* granularity;
    const char* method;
    int k;
    bool bitwise;
  };
  for (const Case& c : {Case{"selective", "", 0, false}, Case{"full", "uniform", 1, true},
                        Case{"full", "uniform", 2, true}, Case{"full", "uniform", 3, true},
                        Case{"full", "block", 2, true}, Case{"full", "block", 4, true}}) {
    TransformerConfig cfg = base;
    cfg.recompute_granularity = c.granularity;
    cfg.recompute_method = c.method;
    cfg.recompute_num_layers = c.k;
    const RunResult r = run(cfg, in, 7);
    SCOPED_TRACE(std::string(c.granularity) + " " + c.method + " " + std::to_string(c.k));
    EXPECT_EQ(r.loss.loss_sum, ref.loss.loss_sum);
    if (c.bitwise)
      EXPECT_EQ(max_rel_diff(ref, r), 0.0);
    else
      EXPECT_LE(max_rel_diff(ref, r), 1e-6);
    EXPECT_LT(r.activation_bytes, ref.activation_bytes);
  }
}

TEST(GPTModel, DropoutMasksArePureFunctionsOfOffset) {
  const TransformerConfig cfg = dropout_config();
  Batch in = testing::random_inputs(2, cfg.seq_length, cfg.padded_vocab_size, 12, false);
  const RunResult a = run(cfg, in, 5), b = run(cfg, in, 5), c = run(cfg, in, 6);
  EXPECT_EQ(a.loss.loss_sum, b.loss.loss_sum);
  EXPECT_EQ(max_rel_diff(a, b), 0.0);
  EXPECT_NE(a.loss.loss_sum, c.loss.loss_sum);
}

TEST(GPTModel, EvalLossMatchesTrainingLossWithoutDropout) {
  const TransformerConfig cfg = testing::tiny_config();
  Batch in = testing::random_inputs(3, cfg.seq_length, cfg.padded_vocab_size, 13, true);
  GPTModel m(cfg, 1);
  testing::randomise(m, 4);
  LossResult eval = m.forward_loss(in);
  LossResult train = m.forward_backward(in, 1.0f, 0);
  EXPECT_EQ(eval.loss_sum, train.loss_sum);
  EXPECT_EQ(eval.num_tokens, train.num_tokens);
  // Loss recomputed from the logits.
  Tensor logits = m.forward_logits(in.tokens, in.position_ids, in.attention_start);
  const int64_t V = cfg.padded_vocab_size;
  double sum = 0;
  for (int64_t t = 0; t < in.tokens.numel(); ++t) {
    const float* z = logits.data<float>() + t * V;
    double mx = z[0], se = 0;
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, double(z[j]));
    for (int64_t j = 0; j < V; ++j) se += std::exp(double(z[j]) - mx);
    sum += (mx + std::log(se) - z[in.labels.data<int32_t>()[t]]) * in.loss_mask.data<float>()[t];
  }
  EXPECT_NEAR(eval.loss_sum, sum, 1e-5 * std::abs(sum));
}

TEST(GPTModel, HalfParamsComputeLikeFp32WithSameValues) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    TransformerConfig c16 = dropout_config();
    c16.params_dtype = dt;
    TransformerConfig c32 = dropout_config();
    Batch in = testing::random_inputs(2, c32.seq_length, c32.padded_vocab_size, 14, true);
    GPTModel m16(c16, 42), m32(c32, 42);
    testing::randomise(m16, 3);
    ParameterList p16 = m16.parameters(), p32 = m32.parameters();
    ASSERT_EQ(p16.size(), p32.size());
    for (size_t i = 0; i < p16.size(); ++i) {
      EXPECT_EQ(p16[i]->value.dtype(), dt);
      EXPECT_EQ(p16[i]->grad.dtype(), DType::F32);
      p32[i]->value.copy_(p16[i]->value.to(DType::F32));
    }
    testing::zero_grads(m16);
    testing::zero_grads(m32);
    LossResult a = m16.forward_backward(in, 1.0f, 3), b = m32.forward_backward(in, 1.0f, 3);
    EXPECT_EQ(a.loss_sum, b.loss_sum);
    for (size_t i = 0; i < p16.size(); ++i)
      EXPECT_EQ(p16[i]->grad.to_float_vector(), p32[i]->grad.to_float_vector()) << p16[i]->name;
  }
}

TEST(GPTModel, ParameterNamesShapesAndInit) {
  TransformerConfig c = testing::tiny_config();
  c.init_method_std = 0.05f;
  GPTModel m(c, 9);
  ParameterList ps = m.parameters();
  ASSERT_EQ(ps.size(), size_t(2 + 12 * c.num_layers + 2));
  EXPECT_EQ(ps[0]->name, "embedding.word_embeddings.weight");
  EXPECT_EQ(ps[0]->value.shape(), (Shape{96, 32}));
  EXPECT_EQ(ps[1]->name, "embedding.position_embeddings.weight");
  const char* names[] = {"input_layernorm.weight", "input_layernorm.bias",
                         "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                         "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
                         "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
                         "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
                         "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};
  for (int l = 0; l < c.num_layers; ++l)
    for (int k = 0; k < 12; ++k)
      EXPECT_EQ(ps[size_t(2 + 12 * l + k)]->name,
                "decoder.layers." + std::to_string(l) + "." + names[k]);
  EXPECT_EQ(ps[ps.size() - 2]->name, "decoder.final_layernorm.weight");
  EXPECT_EQ(ps[4]->value.shape(), (Shape{96, 32}));   // linear_qkv [3h, h]
  EXPECT_EQ(ps[6]->value.shape(), (Shape{32, 32}));   // linear_proj [h, h]
  EXPECT_EQ(ps[10]->value.shape(), (Shape{128, 32})); // fc1 [4h, h]
  EXPECT_EQ(ps[12]->value.shape(), (Shape{32, 128})); // fc2 [h, 4h]
  auto stdev = [](const Parameter* p) {
    double s = 0;
    for (float v : p->value.to_float_vector()) s += double(v) * v;
    return std::sqrt(s / double(p->value.numel()));
  };
  EXPECT_NEAR(stdev(ps[0]), 0.05, 0.005);
  EXPECT_NEAR(stdev(ps[4]), 0.05, 0.005);
  EXPECT_NEAR(stdev(ps[12]), 0.05 / std::sqrt(4.0), 0.003);  // fc2: std / sqrt(2L)
  EXPECT_EQ(stdev(ps[5]), 0.0);                               // biases 0
  for (float v : ps[2]->value.to_float_vector()) EXPECT_EQ(v, 1.0f);  // LN weight 1
  EXPECT_FALSE(ps[5]->weight_decay);
  EXPECT_TRUE(ps[4]->weight_decay);
  EXPECT_EQ(ps[4]->partition_dim, 0);
  EXPECT_EQ(ps[6]->partition_dim, 1);
}

TEST(GPTModel, RejectsBadConfigsAndInputs) {
  TransformerConfig c = testing::tiny_config();
  c.recompute_granularity = "full";
  EXPECT_THROW(GPTModel(c, 1), Error);  // no method
  c.recompute_method = "uniform";
  c.recompute_num_layers = 0;
  EXPECT_THROW(GPTModel(c, 1), Error);
  c = testing::tiny_config();
  c.hidden_size = 30;  // not divisible by 4 heads
  EXPECT_THROW(GPTModel(c, 1), Error);
  c = testing::tiny_config();
  c.recompute_granularity = "partial";
  EXPECT_THROW(GPTModel(c, 1), Error);
  GPTModel m(testing::tiny_config(), 1);
  Batch in = testing::random_inputs(1, 16, 96, 1, false);
  in.tokens.data<int32_t>()[3] = 96;
  EXPECT_THROW(m.forward_loss(in), Error);
  in = testing::random_inputs(1, 16, 96, 1, false);
  in.labels.data<int32_t>()[5] = -1;
  EXPECT_THROW(m.forward_loss(in), Error);
  in = testing::random_inputs(1, 16, 96, 1, false);
  in.loss_mask = Tensor();
  EXPECT_THROW(m.forward_loss(in), Error);
}

}  // namespace
}  // namespace megatron::model
