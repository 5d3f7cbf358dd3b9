// Every layer's backward against central finite differences of its forward, for inputs and
// parameters, on a few random coordinates each. The layers compute in fp32, so the differences
// use a step of 1e-2 and the loss sum(out * R) is accumulated in double; the tolerance (1% of the
// tensor's gradient scale) is set by fp32 rounding. The tight end-to-end check of the same
// backward code is gpt_reference_test.cpp (float64 PyTorch, 1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/rng.h"
#include "model/attention.h"
#include "model/layer_spec.h"
#include "model/mlp.h"
#include "model/norm.h"
#include "model/parallel_layers.h"
#include "model/transformer_layer.h"

namespace megatron::model {
namespace {

Tensor randn(const Shape& s, uint64_t stream, float sd = 1.0f) {
  Tensor t = Tensor::empty(s, DType::F32);
  Philox(31, stream).fill_normal(t.data<float>(), t.numel(), 0.0f, sd);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.data<float>()[i]) * b.data<float>()[i];
  return s;
}

LayerContext make_ctx(int64_t b, int64_t s, bool dropout) {
  LayerContext c;
  c.training = dropout;
  c.save = true;
  c.seed = 5;
  c.dropout_offset = 2;
  c.batch = b;
  c.seq = s;
  std::vector<int32_t> st(size_t(b * s));
  for (int64_t i = 0; i < b * s; ++i) st[size_t(i)] = int32_t(i % s >= 3 ? 3 : 0);
  c.attention_start = Tensor::from_vector(st, {b, s});
  return c;
}

// forward(ctx, x) -> out; backward(ctx, dout) -> dx (may be undefined for no input grad).
void gradcheck(const std::string& what, const LayerContext& ctx, Tensor x,
               const std::function<Tensor(const LayerContext&, const Tensor&)>& fwd,
               const std::function<Tensor(const LayerContext&, const Tensor&)>& bwd,
               ParameterList params) {
  for (Parameter* p : params) p->grad.zero_();
  Tensor out = fwd(ctx, x);
  Tensor R = randn(out.shape(), 99);
  Tensor dx = bwd(ctx, R);
  LayerContext nosave = ctx;
  nosave.save = false;
  auto loss = [&]() { return dot(fwd(nosave, x), R); };
  auto check = [&](const std::string& name, Tensor value, const Tensor& grad) {
    double scale = 1e-12;
    for (float g : grad.to_float_vector()) scale = std::max(scale, double(std::abs(g)));
    float* v = value.data<float>();
    for (int k = 0; k < 6; ++k) {
      const int64_t i = int64_t(Philox(7, uint64_t(k)).u32(0) % uint32_t(value.numel()));
      const float orig = v[i], h = 1e-2f;
      v[i] = orig + h;
      const double up = loss();
      v[i] = orig - h;
      const double dn = loss();
      v[i] = orig;
      const double fd = (up - dn) / (2.0 * double(h));
      EXPECT_NEAR(grad.data<float>()[i], fd, 1e-2 * scale) << what << " " << name << "[" << i << "]";
    }
  };
  if (dx.defined()) check("input", x, dx);
  for (Parameter* p : params) check(p->name, p->value, p->grad);
}

TransformerConfig layer_config(int h, int heads, int groups) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = h;
  c.num_attention_heads = heads;
  c.num_query_groups = groups;
  c.seq_length = 8;
  c.max_position_embeddings = 8;
  c.padded_vocab_size = 16;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

void randomise(const ParameterList& ps, uint64_t seed) {
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor r = randn(ps[i]->value.shape(), seed + i, 0.3f);
    if (ps[i]->name.find("layernorm.weight") != std::string::npos)
      for (int64_t j = 0; j < r.numel(); ++j) r.data<float>()[j] += 1.0f;
    ps[i]->value.copy_(r);
  }
}

TEST(LayerGradcheck, Norms) {
  for (const char* kind : {"LayerNorm", "RMSNorm"})
    for (bool one_p : {false, true}) {
      NormOptions o;
      o.zero_centered_gamma = one_p;
      Norm ln("ln", 16, norm_kind(kind), DType::F32, o);
      ParameterList ps = ln.parameters();
      EXPECT_EQ(ps.size(), std::string(kind) == "LayerNorm" ? 2u : 1u);
      randomise(ps, 1);
      ln.refresh_working_weights();
      LayerContext ctx = make_ctx(2, 5, false);
      gradcheck(std::string(kind) + (one_p ? " 1p" : ""), ctx, randn({10, 16}, 3),
                [&](const LayerContext& c, const Tensor& x) {
                  ln.refresh_working_weights();
                  return ln.forward(c, x);
                },
                [&](const LayerContext& c, const Tensor& d) { return ln.backward(c, d); }, ps);
    }
}

TEST(LayerGradcheck, ColumnAndRowParallelLinear) {
  for (bool bias : {true, false}) {
    LinearOptions o;
    o.bias = bias;
    ColumnParallelLinear col("col", 12, 20, DType::F32, TensorParallel::none(), o);
    RowParallelLinear row("row", 20, 12, DType::F32, TensorParallel::none(), o);
    ParameterList ps = col.parameters();
    for (Parameter* p : row.parameters())
      if (p->name != "row.bias") ps.push_back(p);  // added by the caller's bias-dropout-add
    EXPECT_EQ(ps.size(), bias ? 3u : 2u);
    randomise(ps, 4);
    LayerContext ctx = make_ctx(2, 4, false);
    auto fwd = [&](const LayerContext& c, const Tensor& x) { return row.forward(c, col.forward(c, x)); };
    auto bwd = [&](const LayerContext& c, const Tensor& d) { return col.backward(c, row.backward(c, d)); };
    gradcheck("Linear", ctx, randn({8, 12}, 5), fwd, bwd, ps);
  }
}

// Each attention variant of the layer spec: dropout with document starts (stored and selective
// recompute), rotary (halves, interleaved, partial), per-head q/k norms, ALiBi, a sliding window,
// bidirectional attention with a padding mask, grouped-query attention.
TEST(LayerGradcheck, SelfAttentionVariants) {
  struct Case {
    const char* name;
    std::function<void(TransformerConfig&)> set;
    bool selective = false, padding = false;
  };
  const std::vector<Case> cases = {
      {"dropout+starts", [](TransformerConfig& c) { c.attention_dropout = 0.2f; }},
      {"selective", [](TransformerConfig& c) { c.attention_dropout = 0.2f; }, true},
      {"rope", [](TransformerConfig& c) { c.position_embedding_type = "rope"; }},
      {"rope interleaved partial",
       [](TransformerConfig& c) {
         c.position_embedding_type = "rope";
         c.rotary_interleaved = true;
         c.rotary_percent = 0.5f;
       }},
      {"qk layernorm + rope",
       [](TransformerConfig& c) {
         c.qk_layernorm = true;
         c.position_embedding_type = "rope";
       }},
      {"qk rmsnorm 1p",
       [](TransformerConfig& c) {
         c.qk_layernorm = true;
         c.normalization = "RMSNorm";
         c.apply_layernorm_1p = true;
       }},
      {"alibi", [](TransformerConfig& c) { c.position_embedding_type = "alibi"; }},
      {"window", [](TransformerConfig& c) { c.window_left = 2; }},
      {"bidirectional+padding+window",
       [](TransformerConfig& c) {
         c.attention_mask_type = "bidirectional";
         c.window_left = 3;
         c.window_right = 1;
       },
       false, true},
      {"no biases", [](TransformerConfig& c) { c.add_bias_linear = false; }},
  };
  for (const Case& k : cases) {
    TransformerConfig cfg = layer_config(16, 4, 2);
    k.set(cfg);
    const TransformerLayerSpec spec = gpt_layer_spec(cfg);
    SelfAttention attn("attn", cfg, spec.self_attention, 0);
    ParameterList ps = attn.parameters();
    std::vector<Parameter*> checked;
    for (Parameter* p : ps)
      if (p->name != "attn.linear_proj.bias") checked.push_back(p);
    randomise(ps, 6);
    attn.refresh_working_weights();
    LayerContext ctx = make_ctx(2, 6, cfg.attention_dropout > 0);
    ctx.recompute_core_attention = k.selective;
    if (!cfg.causal()) ctx.attention_start = Tensor();
    if (k.padding)
      ctx.key_padding = Tensor::from_vector(std::vector<int32_t>{1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}, {2, 6});
    if (cfg.rope()) {
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < 12; ++i) pos.push_back(int32_t(i % 6));
      ctx.rope_positions = Tensor::from_vector(pos, {12});
    }
    gradcheck(std::string("SelfAttention ") + k.name, ctx, randn({12, 16}, 7),
              [&](const LayerContext& c, const Tensor& x) {
                attn.refresh_working_weights();
                return attn.forward(c, x);
              },
              [&](const LayerContext& c, const Tensor& d) { return attn.backward(c, d); }, checked);
  }
}

TEST(LayerGradcheck, MLPActivations) {
  for (const char* act : {"gelu_tanh", "gelu", "swiglu", "squared_relu"}) {
    TransformerConfig cfg = layer_config(8, 2, 2);
    cfg.ffn_hidden_size = 24;
    cfg.activation = act;
    MLP mlp("mlp", cfg, gpt_layer_spec(cfg).mlp);
    ParameterList ps = mlp.parameters();
    std::vector<Parameter*> checked;
    for (Parameter* p : ps)
      if (p->name != "mlp.linear_fc2.bias") checked.push_back(p);
    randomise(ps, 8);
    EXPECT_EQ(mlp.linear_fc1.weight.param.value.size(0), std::string(act) == "swiglu" ? 48 : 24);
    LayerContext ctx = make_ctx(2, 3, false);
    gradcheck(std::string("MLP ") + act, ctx, randn({6, 8}, 9),
              [&](const LayerContext& c, const Tensor& x) { return mlp.forward(c, x); },
              [&](const LayerContext& c, const Tensor& d) { return mlp.backward(c, d); }, checked);
  }
}

TEST(LayerGradcheck, TransformerLayerWithDropout) {
  for (bool llama : {false, true}) {
    TransformerConfig cfg = layer_config(16, 2, 2);
    cfg.ffn_hidden_size = 32;
    cfg.hidden_dropout = 0.1f;
    cfg.attention_dropout = 0.1f;
    if (llama) {
      cfg.normalization = "RMSNorm";
      cfg.activation = "swiglu";
      cfg.position_embedding_type = "rope";
      cfg.num_query_groups = 1;
      cfg.add_bias_linear = false;
    }
    TransformerLayer layer(1, cfg, gpt_layer_spec(cfg));
    ParameterList ps = layer.parameters();
    randomise(ps, 50);
    layer.refresh_working_weights();
    LayerContext ctx = make_ctx(2, 5, true);
    if (llama) {
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < 10; ++i) pos.push_back(int32_t(i % 5));
      ctx.rope_positions = Tensor::from_vector(pos, {10});
    }
    gradcheck(llama ? "TransformerLayer llama" : "TransformerLayer", ctx, randn({10, 16}, 11),
              [&](const LayerContext& c, const Tensor& x) { return layer.forward(c, x); },
              [&](const LayerContext& c, const Tensor& d) { return layer.backward(c, d); }, ps);
  }
}

TEST(LayerGradcheck, EmbeddingWithDropout) {
  for (bool positions : {true, false}) {
    Embedding emb(13, positions ? 9 : 0, 8, 0.2f, DType::F32);
    ParameterList ps = emb.parameters();
    EXPECT_EQ(ps.size(), positions ? 2u : 1u);
    randomise(ps, 12);
    std::vector<int32_t> tok = {1, 5, 5, 12, 0, 3}, pos = {0, 1, 2, 0, 1, 2};
    Tensor t = Tensor::from_vector(tok, {2, 3}), p = Tensor::from_vector(pos, {2, 3});
    LayerContext ctx = make_ctx(2, 3, true);
    gradcheck("Embedding", ctx, Tensor::zeros({1}, DType::F32),
              [&](const LayerContext& c, const Tensor&) { return emb.forward(c, t, p); },
              [&](const LayerContext& c, const Tensor& d) {
                emb.backward(c, d);
                return Tensor();
              },
              ps);
  }
}

}  // namespace
}  // namespace megatron::model
