// Forward and backward of cross-attention (see cross_attention.h). All compute goes through ops.
#include "model/cross_attention.h"

#include "model/attention.h"
#include "model/inference_context.h"

namespace megatron::model {

namespace {

LinearOptions linear_options(bool bias, bool grad, InitMethod init = InitMethod::normal) {
  LinearOptions o;
  o.bias = bias;
  o.grad = grad;
  o.init = init;
  return o;
}

}  // namespace

CrossAttention::CrossAttention(const std::string& prefix, const TransformerConfig& cfg,
                               int layer_, const TensorParallel& tp, bool grad)
    : linear_q(prefix + ".linear_q", cfg.hidden_size,
               int64_t(cfg.num_attention_heads) * cfg.head_dim(), cfg.params_dtype, tp,
               linear_options(cfg.add_bias_linear, grad)),
      linear_kv(prefix + ".linear_kv", cfg.hidden_size,
                2 * int64_t(cfg.num_attention_heads) * cfg.head_dim(), cfg.params_dtype, tp,
                linear_options(cfg.add_bias_linear, grad)),
      linear_proj(prefix + ".linear_proj", int64_t(cfg.num_attention_heads) * cfg.head_dim(),
                  cfg.hidden_size, cfg.params_dtype, tp,
                  linear_options(cfg.add_bias_linear, grad, InitMethod::scaled_normal)),
      heads(cfg.num_attention_heads / tp.size()),
      head_dim(cfg.head_dim()),
      head_offset(tp.rank() * (cfg.num_attention_heads / tp.size())),
      total_heads(cfg.num_attention_heads),
      layer(layer_),
      context_shards(tp.sequence_parallel ? tp.size() : 1),
      attention_dropout(cfg.attention_dropout) {
  MG_REQUIRE(cfg.query_groups() == cfg.num_attention_heads,
             "cross-attention has no grouped-query form (Megatron-Core's CrossAttention): "
             "--num-query-groups ", cfg.query_groups(), " must equal --num-attention-heads ",
             cfg.num_attention_heads, " (or drop --group-query-attention)");
  register_child(linear_q);
  register_child(linear_kv);
  register_child(linear_proj);
}

ops::AttentionShape CrossAttention::shape(const LayerContext& ctx) const {
  ops::AttentionShape s =
      local_attention_shape(ctx, heads, heads, head_dim, head_offset, total_heads);
  s.kv_seq = ctx.context_seq;
  return s;
}

ops::AttentionMask CrossAttention::mask(const LayerContext& ctx) const {
  ops::AttentionMask m;
  m.causal = false;
  m.key_padding = ctx.context_padding;
  return m;
}

ops::AttentionInputs CrossAttention::inputs(const Tensor& q, const Tensor& kv,
                                            const LayerContext& ctx) const {
  ops::AttentionInputs in;
  in.q = q;
  in.k = in.v = kv;
  in.q_layout = ops::HeadLayout::heads(heads, head_dim, ctx.seq);
  in.k_layout = ops::HeadLayout::kv(ops::QkvPart::Key, heads, head_dim, ctx.context_seq);
  in.v_layout = ops::HeadLayout::kv(ops::QkvPart::Value, heads, head_dim, ctx.context_seq);
  return in;
}

// Generation: row r (slot row_slot[r]) attends the cached keys and values of its slot's encoder
// output: the cache is the key/value operand with one sequence per slot, row_slot its kv_index.
Tensor CrossAttention::cached_forward(const LayerContext& ctx, const Tensor& x) {
  const InferenceContext& ic = *ctx.inference;
  MG_CHECK(size_t(layer) < ic.cross_kv.size() && ic.cross_kv[size_t(layer)].defined() &&
               ic.cross_seq > 0,
           "CrossAttention: no cross-attention cache for layer ", layer);
  const Tensor& kv = ic.cross_kv[size_t(layer)];
  Tensor q = linear_q.forward(ctx, x);
  const int64_t rows = q.size(0);
  ops::AttentionShape sh = local_attention_shape(ctx, heads, heads, head_dim, head_offset,
                                                 total_heads);
  sh.batch = rows;
  sh.seq = 1;
  sh.kv_seq = ic.cross_seq;
  ops::AttentionInputs in;
  in.q = q;
  in.k = in.v = kv;
  in.q_layout = ops::HeadLayout::heads(heads, head_dim, 1);
  in.k_layout = ops::HeadLayout::kv(ops::QkvPart::Key, heads, head_dim, ic.cross_seq);
  in.v_layout = ops::HeadLayout::kv(ops::QkvPart::Value, heads, head_dim, ic.cross_seq);
  in.kv_index = ic.row_slot;
  ops::AttentionMask m;
  m.causal = false;
  m.key_padding = ic.cross_padding;
  Tensor c = Tensor::empty({rows, int64_t(heads) * head_dim}, DType::F32, q.device());
  ops::attention_fwd(c, Tensor(), Tensor(), in, m, sh, ops::DropoutSpec{});
  return linear_proj.forward(ctx, c);
}

Tensor CrossAttention::forward(const LayerContext& ctx, const Tensor& x) {
  if (ctx.inference) return cached_forward(ctx, x);
  MG_CHECK(ctx.context.defined() && ctx.context_seq > 0 &&
               ctx.context.size(0) * context_shards == ctx.batch * ctx.context_seq,
           "CrossAttention: the layer context has no encoder output for ", ctx.batch,
           " sequences");
  Tensor q = linear_q.forward(ctx, x);
  Tensor kv = linear_kv.forward(ctx, ctx.context);
  const ops::AttentionShape sh = shape(ctx);
  const Device dev = q.device();
  Tensor c = Tensor::empty({q.size(0), int64_t(heads) * head_dim}, DType::F32, dev);
  Tensor lse = Tensor::empty({ctx.batch, heads, ctx.seq}, DType::F32, dev);
  Tensor probs;
  if (ctx.save && !ctx.recompute_core_attention)
    probs = Tensor::empty({ctx.batch, heads, ctx.seq, ctx.context_seq}, DType::F32, dev);
  ops::attention_fwd(c, lse, probs, inputs(q, kv, ctx), mask(ctx), sh,
                     ctx.dropout(attention_dropout, layer, kSiteCrossAttentionProbs));
  Tensor y = linear_proj.forward(ctx, c);
  if (ctx.save) {
    q_ = q;
    kv_ = kv;
    lse_ = lse;
    probs_ = probs;
    ctx_ = c;
  }
  return y;
}

Tensor CrossAttention::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(q_.defined(), "CrossAttention::backward without a saved forward");
  MG_CHECK(ctx.context_grad.defined() && ctx.context_grad.shape() == ctx.context.shape(),
           "CrossAttention::backward: the layer context has no context gradient buffer");
  Tensor dc = linear_proj.backward(ctx, dy);
  Tensor dq = Tensor::empty(q_.get().shape(), DType::F32, dc.device());
  Tensor dkv = Tensor::empty(kv_.get().shape(), DType::F32, dc.device());
  ops::attention_bwd({dq, dkv, dkv, Tensor()}, dc, ctx_, lse_, probs_, inputs(q_, kv_, ctx),
                     mask(ctx), shape(ctx),
                     ctx.dropout(attention_dropout, layer, kSiteCrossAttentionProbs));
  q_.reset();
  kv_.reset();
  lse_.reset();
  probs_.reset();
  ctx_.reset();
  Tensor dcontext = linear_kv.backward(ctx, dkv);
  ops::add(ctx.context_grad, ctx.context_grad, dcontext);
  return linear_q.backward(ctx, dq);
}

}  // namespace megatron::model
