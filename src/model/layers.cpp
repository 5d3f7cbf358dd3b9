// Forward and backward of the GPT layers (see layers.h). All compute is fp32 through the ops
// interface; weight gradients are accumulated straight into Parameter::grad by the GEMMs.
#include "model/layers.h"

#include <cmath>
#include <utility>

#include "kernels/ops.h"

namespace megatron::model {

// ---- LayerNorm -----------------------------------------------------------------------------
LayerNorm::LayerNorm(const std::string& prefix, int64_t h, float eps_, DType dtype, bool sp)
    : eps(eps_) {
  weight.init(prefix + ".weight", {h}, dtype, false, -1, sp);
  bias.init(prefix + ".bias", {h}, dtype, false, -1, sp);
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

// ---- SelfAttention -------------------------------------------------------------------------
// This rank's heads and query groups of a layer with dims `d` split over `tp`.
static AttentionDims local_dims(const AttentionDims& d, const TensorParallel& tp) {
  MG_REQUIRE(d.heads % tp.size() == 0 && d.groups % tp.size() == 0, "attention: ", d.heads,
             " heads in ", d.groups, " query groups cannot be split across ", tp.size(),
             " tensor-parallel ranks (both must be divisible by the tensor-parallel size)");
  AttentionDims l = d;
  l.heads = d.heads / tp.size();
  l.groups = d.groups / tp.size();
  return l;
}

// linear_qkv is in Megatron-Core's interleaved layout (per query group: its n/g query heads, its
// key head, its value head), so the column-parallel dim-0 shard of rank r is exactly query groups
// [r*g/T, (r+1)*g/T) with their heads: the attention kernel reads it unchanged.
SelfAttention::SelfAttention(const std::string& prefix, int64_t h, const AttentionDims& d,
                             int layer_, DType dtype, const TensorParallel& tp,
                             const ContextParallel& cp_)
    : linear_qkv(prefix + ".linear_qkv", h,
                 int64_t(d.groups) * (d.heads / d.groups + 2) * d.head_dim, dtype, tp),
      linear_proj(prefix + ".linear_proj", int64_t(d.heads) * d.head_dim, h, dtype, tp),
      dims(local_dims(d, tp)),
      head_offset(tp.rank() * (d.heads / tp.size())),
      total_heads(d.heads),
      layer(layer_),
      cp(cp_) {}

static ops::AttentionShape attention_shape(const LayerContext& ctx, const SelfAttention& a) {
  ops::AttentionShape s;
  s.batch = ctx.batch;
  s.seq = ctx.seq;
  s.heads = a.dims.heads;
  s.groups = a.dims.groups;
  s.head_dim = a.dims.head_dim;
  s.softmax_scale = 1.0f / std::sqrt(float(a.dims.head_dim));
  s.head_offset = a.head_offset;
  s.total_heads = a.total_heads;
  return s;
}

Tensor SelfAttention::forward(const LayerContext& ctx, const Tensor& x) {
  Tensor qkv = linear_qkv.forward(ctx, x);
  const ops::AttentionShape sh = attention_shape(ctx, *this);
  Tensor c = Tensor::empty({ctx.rows(), int64_t(dims.heads) * dims.head_dim}, DType::F32);
  Tensor lse = Tensor::empty({ctx.batch, dims.heads, ctx.seq}, DType::F32);
  Tensor probs;
  const int C = cp.size();
  const bool ring = C > 1 && cp.comm == CpCommType::P2P;
  // The ring recomputes the scores in backward (flash-attention style): no probabilities kept.
  if (ctx.save && !ctx.recompute_core_attention && !ring)
    probs = Tensor::empty({ctx.batch, dims.heads, ctx.seq, C * ctx.seq}, DType::F32);
  const ops::DropoutSpec drop = ctx.dropout(dims.attention_dropout, layer, kSiteAttentionProbs);
  if (ring) {
    ring_attention_fwd(cp, c, lse, qkv, ctx.attention_start, sh, drop);
  } else if (C > 1) {  // this rank's queries against the whole sequence's keys and values
    ops::AttentionShape csh = sh;
    csh.kv_seq = C * ctx.seq;
    const Tensor full = GatherFromContextParallelRegion::forward(cp, qkv, ctx.batch);
    ops::attention_subset_fwd(c, lse, probs, full,
                              context_parallel_positions(ctx.seq, cp.rank(), C),
                              ctx.attention_start, csh, drop);
  } else {
    ops::attention_fwd(c, lse, probs, qkv, ctx.attention_start, sh, drop);
  }
  Tensor y = linear_proj.forward(ctx, c);
  if (ctx.save) saved = {qkv, lse, probs, c};
  return y;
}
Tensor SelfAttention::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(saved.qkv.defined(), "SelfAttention::backward without a saved forward");
  Tensor dc = linear_proj.backward(ctx, dy);
  const ops::DropoutSpec drop = ctx.dropout(dims.attention_dropout, layer, kSiteAttentionProbs);
  Tensor dqkv;
  const int C = cp.size();
  if (C > 1 && cp.comm == CpCommType::P2P) {
    dqkv = ring_attention_bwd(cp, dc, saved.qkv, saved.ctx, saved.lse, ctx.attention_start,
                              attention_shape(ctx, *this), drop);
  } else if (C > 1) {  // gathered again (not kept); dK / dV go back to the ranks owning the positions
    ops::AttentionShape csh = attention_shape(ctx, *this);
    csh.kv_seq = C * ctx.seq;
    const Tensor full = GatherFromContextParallelRegion::forward(cp, saved.qkv, ctx.batch);
    Tensor dfull = Tensor::empty(full.shape(), DType::F32);
    ops::attention_subset_bwd(dfull, dc, full, context_parallel_positions(ctx.seq, cp.rank(), C),
                              saved.lse, saved.probs, ctx.attention_start, csh, drop);
    dqkv = GatherFromContextParallelRegion::backward(cp, dfull, ctx.batch);
  } else {
    dqkv = Tensor::empty(saved.qkv.shape(), DType::F32);
    ops::attention_bwd(dqkv, dc, saved.qkv, saved.lse, saved.probs, ctx.attention_start,
                       attention_shape(ctx, *this), drop);
  }
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
MLP::MLP(const std::string& prefix, int64_t h, int64_t ffn, bool tanh_, DType dtype,
         const TensorParallel& tp)
    : linear_fc1(prefix + ".linear_fc1", h, ffn, dtype, tp),
      linear_fc2(prefix + ".linear_fc2", ffn, h, dtype, tp),
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
                                   float eps, float hdrop, bool gelu_tanh, DType dtype,
                                   const TensorParallel& tp_, const ContextParallel& cp_)
    : index(idx),
      hidden_dropout(hdrop),
      tp(tp_),
      input_layernorm(layer_prefix(idx) + ".input_layernorm", h, eps, dtype,
                      tp_.sequence_parallel),
      self_attention(layer_prefix(idx) + ".self_attention", h, dims, idx, dtype, tp_, cp_),
      pre_mlp_layernorm(layer_prefix(idx) + ".pre_mlp_layernorm", h, eps, dtype,
                        tp_.sequence_parallel),
      mlp(layer_prefix(idx) + ".mlp", h, ffn, gelu_tanh, dtype, tp_) {}

// Bias-dropout-add over x's rows with the masks of the same rows of the unsharded [N, h] tensor:
// x is rank r's row block under sequence parallelism, and its rows are scattered over the whole
// sequence under context parallelism (LayerContext::for_each_sequence_run).
static int64_t first_row(const TensorParallel& tp, const Tensor& x) {
  return tp.sequence_parallel ? int64_t(tp.rank()) * x.size(0) : 0;
}
static void bda_fwd(const LayerContext& ctx, int64_t row0, const Tensor& out, const Tensor& x,
                    const Tensor& bias, const Tensor& residual, float p, int layer, int site) {
  ctx.for_each_sequence_run(row0, x.size(0), x.size(1), [&](int64_t f, int64_t n, uint64_t off) {
    ops::bias_dropout_add_fwd(out.narrow(0, f, n), x.narrow(0, f, n), bias,
                              residual.narrow(0, f, n), ctx.dropout(p, layer, site, off));
  });
}
static void bda_bwd(const LayerContext& ctx, int64_t row0, const Tensor& dx, const Tensor& dbias,
                    const Tensor& dout, float p, int layer, int site) {
  ctx.for_each_sequence_run(row0, dx.size(0), dx.size(1), [&](int64_t f, int64_t n, uint64_t off) {
    ops::bias_dropout_add_bwd(dx.narrow(0, f, n), dbias, dout.narrow(0, f, n),
                              ctx.dropout(p, layer, site, off));
  });
}

Tensor TransformerLayer::forward(const LayerContext& ctx, const Tensor& x) {
  const int64_t row0 = first_row(tp, x);
  Tensor a = input_layernorm.forward(ctx, x);
  Tensor attn = self_attention.forward(ctx, a);
  Tensor x2 = Tensor::empty(x.shape(), DType::F32);
  bda_fwd(ctx, row0, x2, attn, self_attention.linear_proj.bias.f32, x, hidden_dropout, index,
          kSiteAttentionOut);
  Tensor m = pre_mlp_layernorm.forward(ctx, x2);
  Tensor mo = mlp.forward(ctx, m);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  bda_fwd(ctx, row0, y, mo, mlp.linear_fc2.bias.f32, x2, hidden_dropout, index, kSiteMlpOut);
  if (ctx.save) saved = {x, x2};
  return y;
}

Tensor TransformerLayer::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(saved.x2.defined(), "TransformerLayer::backward without a saved forward");
  const int64_t row0 = first_row(tp, dy);
  // MLP branch: y = x2 + drop(mlp(ln2(x2)) + b)
  Tensor dmo = Tensor::empty(dy.shape(), DType::F32);
  bda_bwd(ctx, row0, dmo, mlp.linear_fc2.bias.param.grad, dy, hidden_dropout, index, kSiteMlpOut);
  Tensor dm = mlp.backward(ctx, dmo);
  Tensor dx2 = dy.clone();
  pre_mlp_layernorm.backward_accumulate(ctx, dm, dx2);
  // Attention branch: x2 = x + drop(attn(ln1(x)) + b)
  Tensor dattn = dmo;  // reuse the buffer
  bda_bwd(ctx, row0, dattn, self_attention.linear_proj.bias.param.grad, dx2, hidden_dropout, index,
          kSiteAttentionOut);
  Tensor da = self_attention.backward(ctx, dattn);
  input_layernorm.backward_accumulate(ctx, da, dx2);
  saved = {};
  return dx2;
}

void TransformerLayer::drop_saved() { (void)take_saved(); }
TransformerLayer::SavedState TransformerLayer::take_saved() {
  SavedState s{std::exchange(saved, {}),
               std::exchange(input_layernorm.saved, {}),
               std::exchange(pre_mlp_layernorm.saved, {}),
               std::exchange(self_attention.saved, {}),
               std::exchange(self_attention.linear_qkv.saved, {}),
               std::exchange(self_attention.linear_proj.saved, {}),
               std::exchange(mlp.saved, {}),
               std::exchange(mlp.linear_fc1.saved, {}),
               std::exchange(mlp.linear_fc2.saved, {})};
  return s;
}
void TransformerLayer::restore_saved(SavedState&& s) {
  saved = std::move(s.layer);
  input_layernorm.saved = std::move(s.input_layernorm);
  pre_mlp_layernorm.saved = std::move(s.pre_mlp_layernorm);
  self_attention.saved = std::move(s.self_attention);
  self_attention.linear_qkv.saved = std::move(s.linear_qkv);
  self_attention.linear_proj.saved = std::move(s.linear_proj);
  mlp.saved = std::move(s.mlp);
  mlp.linear_fc1.saved = std::move(s.linear_fc1);
  mlp.linear_fc2.saved = std::move(s.linear_fc2);
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

}  // namespace megatron::model
