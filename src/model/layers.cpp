// Forward and backward of the GPT layers (see layers.h). All compute is fp32 through the ops
// interface; weight gradients are accumulated straight into Parameter::grad by the GEMMs.
#include "model/layers.h"

#include <cmath>

#include "kernels/ops.h"

namespace megatron::model {

ops::DropoutSpec LayerContext::dropout(float p, int layer, int site) const {
  ops::DropoutSpec d;
  d.p = training ? p : 0.0f;
  d.seed = seed;
  d.stream = (dropout_offset << 24) | (uint64_t(layer + 1) << 4) | uint64_t(site);
  return d;
}

size_t bytes_of(const Tensor& t) { return t.defined() ? t.nbytes() : 0; }

void Weight::init(const std::string& name, const Shape& shape, DType dtype, bool decay, int pdim) {
  param.name = name;
  param.value = Tensor::zeros(shape, dtype);
  param.grad = Tensor::zeros(shape, DType::F32);
  param.weight_decay = decay;
  param.partition_dim = pdim;
  f32 = dtype == DType::F32 ? param.value : Tensor::zeros(shape, DType::F32);
}
void Weight::refresh() {
  if (param.value.dtype() == DType::F32) {
    f32 = param.value;
  } else {
    if (!f32.defined() || f32.shape() != param.value.shape())
      f32 = Tensor::empty(param.value.shape(), DType::F32);
    ops::cast(f32, param.value);
  }
}

// ---- LayerNorm -----------------------------------------------------------------------------
LayerNorm::LayerNorm(const std::string& prefix, int64_t h, float eps_, DType dtype) : eps(eps_) {
  weight.init(prefix + ".weight", {h}, dtype, false, -1);
  bias.init(prefix + ".bias", {h}, dtype, false, -1);
  weight.param.value.fill_(1.0);
  weight.refresh();
}
Tensor LayerNorm::forward(const LayerContext& ctx, const Tensor& x) {
  const int64_t n = x.size(0);
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  Tensor mean, rstd;
  if (ctx.save) {
    mean = Tensor::empty({n}, DType::F32);
    rstd = Tensor::empty({n}, DType::F32);
  }
  ops::layernorm_fwd(out, mean, rstd, x, weight.f32, bias.f32, eps);
  if (ctx.save) saved = {x, mean, rstd};
  return out;
}
void LayerNorm::backward_accumulate(const LayerContext&, const Tensor& dout, const Tensor& dx) {
  MG_CHECK(saved.mean.defined(), "LayerNorm::backward without a saved forward");
  ops::layernorm_bwd(dx, weight.param.grad, bias.param.grad, dout, saved.x, weight.f32,
                     saved.mean, saved.rstd, true);
  saved = {};
}
Tensor LayerNorm::backward(const LayerContext& ctx, const Tensor& dout) {
  MG_CHECK(saved.mean.defined(), "LayerNorm::backward without a saved forward");
  Tensor dx = Tensor::empty(dout.shape(), DType::F32);
  ops::layernorm_bwd(dx, weight.param.grad, bias.param.grad, dout, saved.x, weight.f32,
                     saved.mean, saved.rstd, false);
  (void)ctx;
  saved = {};
  return dx;
}
void LayerNorm::parameters(ParameterList& out) {
  out.push_back(&weight.param);
  out.push_back(&bias.param);
}
void LayerNorm::refresh_working_weights() {
  weight.refresh();
  bias.refresh();
}

// ---- Linear --------------------------------------------------------------------------------
LinearBase::LinearBase(const std::string& prefix, int64_t in, int64_t out, bool skip, DType dtype,
                       int wdim, int bdim)
    : in_features(in), out_features(out), skip_bias_add(skip) {
  weight.init(prefix + ".weight", {out, in}, dtype, true, wdim);
  bias.init(prefix + ".bias", {out}, dtype, false, bdim);
}
Tensor LinearBase::forward(const LayerContext& ctx, const Tensor& x) {
  MG_CHECK(x.dim() == 2 && x.size(1) == in_features, "Linear ", weight.param.name, ": input ",
           shape_str(x.shape()), " does not have ", in_features, " columns");
  Tensor y = Tensor::empty({x.size(0), out_features}, DType::F32);
  ops::gemm(x, false, weight.f32, true, y);
  if (!skip_bias_add) ops::bias_add(y, bias.f32);
  if (ctx.save) saved.x = x;
  return y;
}
Tensor LinearBase::backward(const LayerContext&, const Tensor& dy) {
  MG_CHECK(saved.x.defined(), "Linear::backward without a saved forward");
  Tensor dx = Tensor::empty({dy.size(0), in_features}, DType::F32);
  ops::gemm(dy, false, weight.f32, false, dx);
  ops::gemm(dy, true, saved.x, false, weight.param.grad, 1.0f, 1.0f);
  if (!skip_bias_add) ops::bias_grad(bias.param.grad, dy);
  saved = {};
  return dx;
}
void LinearBase::parameters(ParameterList& out) {
  out.push_back(&weight.param);
  out.push_back(&bias.param);
}
void LinearBase::refresh_working_weights() {
  weight.refresh();
  bias.refresh();
}

// ---- SelfAttention -------------------------------------------------------------------------
SelfAttention::SelfAttention(const std::string& prefix, int64_t h, const AttentionDims& d,
                             int layer_, DType dtype)
    : linear_qkv(prefix + ".linear_qkv", h,
                 int64_t(d.groups) * (d.heads / d.groups + 2) * d.head_dim, dtype),
      linear_proj(prefix + ".linear_proj", int64_t(d.heads) * d.head_dim, h, dtype),
      dims(d),
      layer(layer_) {}

static ops::AttentionShape attention_shape(const LayerContext& ctx, const AttentionDims& d) {
  ops::AttentionShape s;
  s.batch = ctx.batch;
  s.seq = ctx.seq;
  s.heads = d.heads;
  s.groups = d.groups;
  s.head_dim = d.head_dim;
  s.softmax_scale = 1.0f / std::sqrt(float(d.head_dim));
  return s;
}

Tensor SelfAttention::forward(const LayerContext& ctx, const Tensor& x) {
  Tensor qkv = linear_qkv.forward(ctx, x);
  const ops::AttentionShape sh = attention_shape(ctx, dims);
  Tensor c = Tensor::empty({ctx.rows(), int64_t(dims.heads) * dims.head_dim}, DType::F32);
  Tensor lse = Tensor::empty({ctx.batch, dims.heads, ctx.seq}, DType::F32);
  Tensor probs;
  if (ctx.save && !ctx.recompute_core_attention)
    probs = Tensor::empty({ctx.batch, dims.heads, ctx.seq, ctx.seq}, DType::F32);
  ops::attention_fwd(c, lse, probs, qkv, ctx.attention_start, sh,
                     ctx.dropout(dims.attention_dropout, layer, kSiteAttentionProbs));
  Tensor y = linear_proj.forward(ctx, c);
  if (ctx.save) saved = {qkv, lse, probs, c};
  return y;
}
Tensor SelfAttention::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(saved.qkv.defined(), "SelfAttention::backward without a saved forward");
  Tensor dc = linear_proj.backward(ctx, dy);
  Tensor dqkv = Tensor::empty(saved.qkv.shape(), DType::F32);
  ops::attention_bwd(dqkv, dc, saved.qkv, saved.lse, saved.probs, ctx.attention_start,
                     attention_shape(ctx, dims),
                     ctx.dropout(dims.attention_dropout, layer, kSiteAttentionProbs));
  saved = {};
  return linear_qkv.backward(ctx, dqkv);
}
void SelfAttention::parameters(ParameterList& out) {
  linear_qkv.parameters(out);
  linear_proj.parameters(out);
}
void SelfAttention::refresh_working_weights() {
  linear_qkv.refresh_working_weights();
  linear_proj.refresh_working_weights();
}

// ---- MLP -----------------------------------------------------------------------------------
MLP::MLP(const std::string& prefix, int64_t h, int64_t ffn, bool tanh_, DType dtype)
    : linear_fc1(prefix + ".linear_fc1", h, ffn, dtype),
      linear_fc2(prefix + ".linear_fc2", ffn, h, dtype),
      gelu_tanh(tanh_) {}
Tensor MLP::forward(const LayerContext& ctx, const Tensor& x) {
  Tensor h1 = linear_fc1.forward(ctx, x);
  Tensor a1 = Tensor::empty(h1.shape(), DType::F32);
  ops::gelu_fwd(a1, h1, gelu_tanh);
  Tensor y = linear_fc2.forward(ctx, a1);
  if (ctx.save) saved = {h1, a1};
  return y;
}
Tensor MLP::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(saved.h1.defined(), "MLP::backward without a saved forward");
  Tensor da = linear_fc2.backward(ctx, dy);
  ops::gelu_bwd(da, da, saved.h1, gelu_tanh);
  saved = {};
  return linear_fc1.backward(ctx, da);
}
void MLP::parameters(ParameterList& out) {
  linear_fc1.parameters(out);
  linear_fc2.parameters(out);
}
void MLP::refresh_working_weights() {
  linear_fc1.refresh_working_weights();
  linear_fc2.refresh_working_weights();
}

// ---- TransformerLayer ----------------------------------------------------------------------
static std::string layer_prefix(int i) { return "decoder.layers." + std::to_string(i); }

TransformerLayer::TransformerLayer(int idx, int64_t h, int64_t ffn, const AttentionDims& dims,
                                   float eps, float hdrop, bool gelu_tanh, DType dtype)
    : index(idx),
      hidden_dropout(hdrop),
      input_layernorm(layer_prefix(idx) + ".input_layernorm", h, eps, dtype),
      self_attention(layer_prefix(idx) + ".self_attention", h, dims, idx, dtype),
      pre_mlp_layernorm(layer_prefix(idx) + ".pre_mlp_layernorm", h, eps, dtype),
      mlp(layer_prefix(idx) + ".mlp", h, ffn, gelu_tanh, dtype) {}

Tensor TransformerLayer::forward(const LayerContext& ctx, const Tensor& x) {
  Tensor a = input_layernorm.forward(ctx, x);
  Tensor attn = self_attention.forward(ctx, a);
  Tensor x2 = Tensor::empty(x.shape(), DType::F32);
  ops::bias_dropout_add_fwd(x2, attn, self_attention.linear_proj.bias.f32, x,
                            ctx.dropout(hidden_dropout, index, kSiteAttentionOut));
  Tensor m = pre_mlp_layernorm.forward(ctx, x2);
  Tensor mo = mlp.forward(ctx, m);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  ops::bias_dropout_add_fwd(y, mo, mlp.linear_fc2.bias.f32, x2,
                            ctx.dropout(hidden_dropout, index, kSiteMlpOut));
  if (ctx.save) saved = {x, x2};
  return y;
}

Tensor TransformerLayer::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(saved.x2.defined(), "TransformerLayer::backward without a saved forward");
  // MLP branch: y = x2 + drop(mlp(ln2(x2)) + b)
  Tensor dmo = Tensor::empty(dy.shape(), DType::F32);
  ops::bias_dropout_add_bwd(dmo, mlp.linear_fc2.bias.param.grad, dy,
                            ctx.dropout(hidden_dropout, index, kSiteMlpOut));
  Tensor dm = mlp.backward(ctx, dmo);
  Tensor dx2 = dy.clone();
  pre_mlp_layernorm.backward_accumulate(ctx, dm, dx2);
  // Attention branch: x2 = x + drop(attn(ln1(x)) + b)
  Tensor dattn = dmo;  // reuse the buffer
  ops::bias_dropout_add_bwd(dattn, self_attention.linear_proj.bias.param.grad, dx2,
                            ctx.dropout(hidden_dropout, index, kSiteAttentionOut));
  Tensor da = self_attention.backward(ctx, dattn);
  input_layernorm.backward_accumulate(ctx, da, dx2);
  saved = {};
  return dx2;
}

void TransformerLayer::drop_saved() {
  saved = {};
  input_layernorm.saved = {};
  pre_mlp_layernorm.saved = {};
  self_attention.saved = {};
  self_attention.linear_qkv.saved = {};
  self_attention.linear_proj.saved = {};
  mlp.saved = {};
  mlp.linear_fc1.saved = {};
  mlp.linear_fc2.saved = {};
}
size_t TransformerLayer::saved_bytes() const {
  return saved.bytes() + input_layernorm.saved.bytes() + pre_mlp_layernorm.saved.bytes() +
         self_attention.saved.bytes() + mlp.saved.bytes();
}
void TransformerLayer::parameters(ParameterList& out) {
  input_layernorm.parameters(out);
  self_attention.parameters(out);
  pre_mlp_layernorm.parameters(out);
  mlp.parameters(out);
}
void TransformerLayer::refresh_working_weights() {
  input_layernorm.refresh_working_weights();
  self_attention.refresh_working_weights();
  pre_mlp_layernorm.refresh_working_weights();
  mlp.refresh_working_weights();
}

// ---- Embedding -----------------------------------------------------------------------------
Embedding::Embedding(int64_t vocab, int64_t max_positions, int64_t h, float drop, DType dtype)
    : dropout(drop) {
  word.init("embedding.word_embeddings.weight", {vocab, h}, dtype, true, 0);
  position.init("embedding.position_embeddings.weight", {max_positions, h}, dtype, true, -1);
}
Tensor Embedding::forward(const LayerContext& ctx, const Tensor& tokens, const Tensor& pos) {
  const int64_t n = tokens.numel(), h = word.f32.size(1);
  MG_REQUIRE(pos.numel() == n, "position_ids has ", pos.numel(), " elements but tokens has ", n);
  const int64_t V = word.f32.size(0), P = position.f32.size(0);
  const int32_t* tp = tokens.data<int32_t>();
  const int32_t* pp = pos.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MG_REQUIRE(tp[i] >= 0 && tp[i] < V, "token id ", tp[i], " at position ", i,
               " is outside the padded vocabulary [0, ", V,
               "); the data was tokenized with a different tokenizer or vocab size");
    MG_REQUIRE(pp[i] >= 0 && pp[i] < P, "position id ", pp[i], " at position ", i,
               " is outside [0, --max-position-embeddings=", P, ")");
  }
  Tensor out = Tensor::empty({n, h}, DType::F32);
  Tensor p = Tensor::empty({n, h}, DType::F32);
  ops::embedding_fwd(out, tokens, word.f32);
  ops::embedding_fwd(p, pos, position.f32);
  ops::bias_dropout_add_fwd(out, p, Tensor(), out, ops::DropoutSpec{});
  ops::dropout_fwd(out, out, ctx.dropout(dropout, -1, kSiteEmbedding));
  if (ctx.save) saved = {tokens, pos};
  return out;
}
void Embedding::backward(const LayerContext& ctx, const Tensor& dout) {
  MG_CHECK(saved.tokens.defined(), "Embedding::backward without a saved forward");
  Tensor d = Tensor::empty(dout.shape(), DType::F32);
  ops::dropout_bwd(d, dout, ctx.dropout(dropout, -1, kSiteEmbedding));
  ops::embedding_bwd(word.param.grad, saved.tokens, d);
  ops::embedding_bwd(position.param.grad, saved.position_ids, d);
  saved = {};
}
void Embedding::parameters(ParameterList& out) {
  out.push_back(&word.param);
  out.push_back(&position.param);
}
void Embedding::refresh_working_weights() {
  word.refresh();
  position.refresh();
}

}  // namespace megatron::model
