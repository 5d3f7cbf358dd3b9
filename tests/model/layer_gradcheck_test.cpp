// Every layer's backward against central finite differences of its forward, for inputs and
// parameters, on a few random coordinates each. The layers compute in fp32, so the differences
// use a step of 1e-2 and the loss sum(out * R) is accumulated in double; the tolerance (1% of the
// tensor's gradient scale) is set by fp32 rounding. The tight end-to-end check of the same
// backward code is gpt_reference_test.cpp (float64 PyTorch, 1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/rng.h"
#include "model/layers.h"

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

TEST(LayerGradcheck, LayerNorm) {
  LayerNorm ln("ln", 16, 1e-5f, DType::F32);
  ln.weight.param.value.copy_(randn({16}, 1, 0.5f));
  ln.bias.param.value.copy_(randn({16}, 2));
  LayerContext ctx = make_ctx(2, 5, false);
  gradcheck("LayerNorm", ctx, randn({10, 16}, 3),
            [&](const LayerContext& c, const Tensor& x) { return ln.forward(c, x); },
            [&](const LayerContext& c, const Tensor& d) { return ln.backward(c, d); },
            {&ln.weight.param, &ln.bias.param});
}

TEST(LayerGradcheck, ColumnAndRowParallelLinear) {
  ColumnParallelLinear col("col", 12, 20, DType::F32);
  RowParallelLinear row("row", 20, 12, DType::F32);
  for (Weight* w : {&col.weight, &col.bias, &row.weight})
    w->param.value.copy_(randn(w->param.value.shape(), 4, 0.3f));
  LayerContext ctx = make_ctx(2, 4, false);
  auto fwd = [&](const LayerContext& c, const Tensor& x) { return row.forward(c, col.forward(c, x)); };
  auto bwd = [&](const LayerContext& c, const Tensor& d) { return col.backward(c, row.backward(c, d)); };
  gradcheck("Linear", ctx, randn({8, 12}, 5), fwd, bwd,
            {&col.weight.param, &col.bias.param, &row.weight.param});
}

TEST(LayerGradcheck, SelfAttentionWithDropoutAndStarts) {
  for (bool selective : {false, true}) {
    SelfAttention attn("attn", 16, AttentionDims{4, 4, 4, 0.2f}, 0, DType::F32);
    for (Weight* w : {&attn.linear_qkv.weight, &attn.linear_qkv.bias, &attn.linear_proj.weight})
      w->param.value.copy_(randn(w->param.value.shape(), 6, 0.4f));
    LayerContext ctx = make_ctx(2, 6, true);
    ctx.recompute_core_attention = selective;
    gradcheck(selective ? "SelfAttention(selective)" : "SelfAttention", ctx, randn({12, 16}, 7),
              [&](const LayerContext& c, const Tensor& x) { return attn.forward(c, x); },
              [&](const LayerContext& c, const Tensor& d) { return attn.backward(c, d); },
              {&attn.linear_qkv.weight.param, &attn.linear_qkv.bias.param,
               &attn.linear_proj.weight.param});
  }
}

TEST(LayerGradcheck, MLPBothGelus) {
  for (bool tanh_gelu : {true, false}) {
    MLP mlp("mlp", 8, 24, tanh_gelu, DType::F32);
    for (Weight* w : {&mlp.linear_fc1.weight, &mlp.linear_fc1.bias, &mlp.linear_fc2.weight})
      w->param.value.copy_(randn(w->param.value.shape(), 8, 0.4f));
    LayerContext ctx = make_ctx(2, 3, false);
    gradcheck("MLP", ctx, randn({6, 8}, 9),
              [&](const LayerContext& c, const Tensor& x) { return mlp.forward(c, x); },
              [&](const LayerContext& c, const Tensor& d) { return mlp.backward(c, d); },
              {&mlp.linear_fc1.weight.param, &mlp.linear_fc1.bias.param,
               &mlp.linear_fc2.weight.param});
  }
}

TEST(LayerGradcheck, TransformerLayerWithDropout) {
  TransformerLayer layer(1, 16, 32, AttentionDims{2, 2, 8, 0.1f}, 1e-5f, 0.1f, true, DType::F32);
  ParameterList ps;
  layer.parameters(ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor r = randn(ps[i]->value.shape(), 50 + i, 0.3f);
    if (ps[i]->name.find("layernorm.weight") != std::string::npos)
      for (int64_t j = 0; j < r.numel(); ++j) r.data<float>()[j] += 1.0f;
    ps[i]->value.copy_(r);
  }
  LayerContext ctx = make_ctx(2, 5, true);
  gradcheck("TransformerLayer", ctx, randn({10, 16}, 11),
            [&](const LayerContext& c, const Tensor& x) { return layer.forward(c, x); },
            [&](const LayerContext& c, const Tensor& d) { return layer.backward(c, d); }, ps);
}

TEST(LayerGradcheck, EmbeddingWithDropout) {
  Embedding emb(13, 9, 8, 0.2f, DType::F32);
  emb.word.param.value.copy_(randn({13, 8}, 12));
  emb.position.param.value.copy_(randn({9, 8}, 13));
  std::vector<int32_t> tok = {1, 5, 5, 12, 0, 3}, pos = {0, 1, 2, 0, 1, 2};
  Tensor t = Tensor::from_vector(tok, {2, 3}), p = Tensor::from_vector(pos, {2, 3});
  LayerContext ctx = make_ctx(2, 3, true);
  gradcheck("Embedding", ctx, Tensor::zeros({1}, DType::F32),
            [&](const LayerContext& c, const Tensor&) { return emb.forward(c, t, p); },
            [&](const LayerContext& c, const Tensor& d) {
              emb.backward(c, d);
              return Tensor();
            },
            {&emb.word.param, &emb.position.param});
}

}  // namespace
}  // namespace megatron::model
