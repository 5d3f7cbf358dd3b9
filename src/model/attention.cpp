// Forward and backward of self-attention (see attention.h). All compute goes through ops.
#include "model/attention.h"

#include <cmath>

#include "model/inference_context.h"

namespace megatron::model {

namespace {

int local_count(int full, const TensorParallel& tp, const char* what) {
  MG_REQUIRE(full % tp.size() == 0, "attention: ", full, " ", what,
             " cannot be split across ", tp.size(), " tensor-parallel ranks");
  return full / tp.size();
}

LinearOptions linear_options(bool bias, bool grad, InitMethod init = InitMethod::normal) {
  LinearOptions o;
  o.bias = bias;
  o.grad = grad;
  o.init = init;
  return o;
}

// The core attention's operands: with bf16 weights, qkv rounded to bf16, so that the attention
// multiplies in bf16 (the CPU's bf16 attention kernel, the GPU's tensor cores) as Megatron's does
// on bf16 activations; otherwise qkv itself.
Tensor attention_operand(const Tensor& qkv, DType params_dtype) {
  if (params_dtype != DType::BF16 || qkv.dtype() == DType::BF16) return qkv;
  const Tensor src = qkv.contiguous();
  Tensor out = Tensor::empty(src.shape(), DType::BF16, src.device());
  ops::cast(out, src);
  return out;
}

}  // namespace

// linear_qkv is in Megatron-Core's interleaved layout (per query group: its n/g query heads, its
// key head, its value head), so the column-parallel dim-0 shard of rank r is exactly query groups
// [r*g/T, (r+1)*g/T) with their heads: the attention kernels read it unchanged.
SelfAttention::SelfAttention(const std::string& prefix, const TransformerConfig& cfg,
                             const AttentionSpec& spec, int layer_, const TensorParallel& tp,
                             const ContextParallel& cp, bool grad)
    : linear_qkv(prefix + ".linear_qkv", cfg.hidden_size,
                 int64_t(cfg.query_groups()) * (cfg.num_attention_heads / cfg.query_groups() + 2) *
                     cfg.head_dim(),
                 cfg.params_dtype, tp, linear_options(cfg.qkv_bias(), grad)),
      linear_proj(prefix + ".linear_proj", int64_t(cfg.num_attention_heads) * cfg.head_dim(),
                  cfg.hidden_size, cfg.params_dtype, tp,
                  linear_options(cfg.add_bias_linear, grad, InitMethod::scaled_normal)),
      heads(local_count(cfg.num_attention_heads, tp, "heads")),
      groups(local_count(cfg.query_groups(), tp, "query groups")),
      head_dim(cfg.head_dim()),
      head_offset(tp.rank() * (cfg.num_attention_heads / tp.size())),
      total_heads(cfg.num_attention_heads),
      layer(layer_),
      attention_dropout(cfg.attention_dropout),
      spec_(spec),
      window_left_(cfg.window_left),
      window_right_(cfg.window_right),
      cp_(cp) {
  register_child(linear_qkv);
  if (spec.qk_norm) {
    NormOptions o;
    o.eps = cfg.layernorm_epsilon;
    o.zero_centered_gamma = cfg.apply_layernorm_1p;
    o.partial_grad = tp.size() > 1;  // each rank normalises only its own heads
    o.grad = grad;
    q_layernorm = std::make_unique<Norm>(prefix + ".q_layernorm", head_dim, *spec.qk_norm,
                                         cfg.params_dtype, o);
    k_layernorm = std::make_unique<Norm>(prefix + ".k_layernorm", head_dim, *spec.qk_norm,
                                         cfg.params_dtype, o);
    register_child(*q_layernorm);
    register_child(*k_layernorm);
  }
  register_child(linear_proj);
  if (spec.rope) {
    rope_.rotary_dim = cfg.rotary_dim();
    rope_.base = cfg.rotary_base;
    rope_.interleaved = cfg.rotary_interleaved;
  }
}

ops::AttentionShape local_attention_shape(const LayerContext& ctx, int heads, int groups,
                                          int head_dim, int head_offset, int total_heads) {
  ops::AttentionShape s;
  s.batch = ctx.batch;
  s.seq = ctx.seq;
  s.heads = heads;
  s.groups = groups;
  s.head_dim = head_dim;
  s.softmax_scale = 1.0f / std::sqrt(float(head_dim));
  s.head_offset = head_offset;
  s.total_heads = total_heads;
  return s;
}

ops::AttentionShape SelfAttention::shape(const LayerContext& ctx) const {
  return local_attention_shape(ctx, heads, groups, head_dim, head_offset, total_heads);
}

ops::AttentionMask SelfAttention::mask(const LayerContext& ctx) const {
  ops::AttentionMask m;
  m.causal = spec_.causal;
  m.window_left = window_left_;
  m.window_right = window_right_;
  m.alibi = spec_.alibi;
  m.attention_start = ctx.attention_start;
  m.key_padding = ctx.key_padding;
  return m;
}

const Tensor& SelfAttention::head_rows(int64_t n, bool keys, Device device) {
  Tensor& cached = keys ? k_rows_ : q_rows_;
  const int64_t hpg = heads / groups, per_token = int64_t(groups) * (keys ? 1 : hpg);
  if (cached.defined() && cached.numel() == n * per_token && cached.device() == device)
    return cached;
  std::vector<int32_t> idx;
  idx.reserve(size_t(n * per_token));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first = (t * groups + g) * (hpg + 2);
      if (keys) {
        idx.push_back(int32_t(first + hpg));
      } else {
        for (int64_t j = 0; j < hpg; ++j) idx.push_back(int32_t(first + j));
      }
    }
  cached = Tensor::from_vector(idx, {int64_t(idx.size())}, device);
  return cached;
}

// The per-head norms read the query (key) heads as rows of the [N*g*(n/g+2), d] view of qkv,
// normalise them and write them back in place.
void SelfAttention::qk_norm_forward(const LayerContext& ctx, const Tensor& qkv) {
  const int64_t n = qkv.size(0);
  const Tensor rows = qkv.view({-1, head_dim});
  for (bool keys : {false, true}) {
    const Tensor& idx = head_rows(n, keys, qkv.device());
    Tensor h = Tensor::empty({idx.numel(), head_dim}, DType::F32, qkv.device());
    ops::index_select_rows(h, rows, idx);
    Tensor normed = (keys ? k_layernorm : q_layernorm)->forward(ctx, h);
    ops::index_copy_rows(rows, normed, idx);
  }
}

void SelfAttention::qk_norm_backward(const LayerContext& ctx, const Tensor& dqkv) {
  const int64_t n = dqkv.size(0);
  const Tensor rows = dqkv.view({-1, head_dim});
  for (bool keys : {false, true}) {
    const Tensor& idx = head_rows(n, keys, dqkv.device());
    Tensor d = Tensor::empty({idx.numel(), head_dim}, DType::F32, dqkv.device());
    ops::index_select_rows(d, rows, idx);
    Tensor dx = (keys ? k_layernorm : q_layernorm)->backward(ctx, d);
    ops::index_copy_rows(rows, dx, idx);
  }
}

namespace {

// Self-attention over this rank's tokens: queries, keys and values are the fused QKV itself.
ops::AttentionInputs self_inputs(const Tensor& qkv, const ops::AttentionShape& sh) {
  ops::AttentionInputs in;
  in.q = in.k = in.v = qkv;
  in.q_layout = ops::HeadLayout::qkv(ops::QkvPart::Query, sh.heads, sh.groups, sh.head_dim, sh.seq);
  in.k_layout = ops::HeadLayout::qkv(ops::QkvPart::Key, sh.heads, sh.groups, sh.head_dim, sh.seq);
  in.v_layout = ops::HeadLayout::qkv(ops::QkvPart::Value, sh.heads, sh.groups, sh.head_dim, sh.seq);
  return in;
}

}  // namespace

// Generation: each row's key and value go into its slot of the layer's cache at its position;
// the rows (one query batch row each) then attend their slots' cached positions: the cache is the
// key/value operand, row_slot the key/value sequence of each row, row_pos its query position.
void SelfAttention::cached_attention(const LayerContext& ctx, const Tensor& qkv,
                                     const Tensor& out) const {
  InferenceContext& ic = *ctx.inference;
  MG_CHECK(size_t(layer) < ic.key_cache.size(), "SelfAttention: no KV cache for layer ", layer);
  const Tensor& kc = ic.key_cache[size_t(layer)];
  const Tensor& vc = ic.value_cache[size_t(layer)];
  ops::AttentionShape sh = shape(ctx);
  // A bf16 cache takes the rows rounded to bf16, and the attention runs on bf16 q, k and v.
  const Tensor rows = attention_operand(qkv, kc.dtype());
  ops::kv_cache_append(kc, vc, rows, ic.row_slot, ic.row_pos, sh);
  const int64_t max_len = kc.size(2);
  sh.batch = qkv.size(0);
  sh.seq = 1;
  sh.kv_seq = max_len;
  sh.q_span = sh.kv_span = max_len;
  ops::AttentionInputs in;
  in.q = rows;
  in.q_layout = ops::HeadLayout::qkv(ops::QkvPart::Query, heads, groups, head_dim, 1);
  in.k = kc;
  in.v = vc;
  in.k_layout = in.v_layout = ops::HeadLayout::cache(groups, max_len, head_dim);
  in.q_positions = ic.row_pos;
  in.kv_index = ic.row_slot;
  if (spec_.relative_bias) {  // the bias of the whole [max_len, max_len] attention (T5's decoder)
    MG_CHECK(ctx.attention_bias.defined() &&
                 ctx.attention_bias.shape() == Shape({1, heads, max_len, max_len}),
             "SelfAttention: the relative position bias [1, ", heads, ", ", max_len, ", ", max_len,
             "] of the cache's positions is missing from the layer context");
    in.bias = ctx.attention_bias;
  }
  ops::AttentionMask m = mask(ctx);
  m.attention_start = m.key_padding = Tensor();  // the cache holds one sequence per slot
  ops::attention_fwd(out, Tensor(), Tensor(), in, m, sh, ops::DropoutSpec{});
}

// The operands of local attention: the fused QKV, with the block's relative position bias when
// the spec reads it.
ops::AttentionInputs SelfAttention::inputs(const LayerContext& ctx, const Tensor& qkv,
                                           const ops::AttentionShape& sh) const {
  ops::AttentionInputs in = self_inputs(qkv, sh);
  if (spec_.relative_bias) {
    MG_CHECK(ctx.attention_bias.defined() &&
                 ctx.attention_bias.shape() == Shape({1, heads, ctx.seq, ctx.seq}),
             "SelfAttention: the relative position bias [1, ", heads, ", ", ctx.seq, ", ",
             ctx.seq, "] is missing from the layer context");
    in.bias = ctx.attention_bias;
  }
  return in;
}

Tensor SelfAttention::forward(const LayerContext& ctx, const Tensor& x) {
  Tensor qkv = linear_qkv.forward(ctx, x);
  if (q_layernorm) qk_norm_forward(ctx, qkv);
  if (spec_.rope) {
    MG_CHECK(ctx.rope_positions.defined() && ctx.rope_positions.numel() == qkv.size(0),
             "SelfAttention: rotary positions for ", qkv.size(0), " rows are missing");
    ops::rope_fwd(qkv, ctx.rope_positions, shape(ctx), rope_);
  }
  const ops::AttentionShape sh = shape(ctx);
  const Device dev = qkv.device();
  const int64_t rows = qkv.size(0);
  Tensor c = Tensor::empty({rows, int64_t(heads) * head_dim}, DType::F32, dev);
  if (ctx.inference) {
    cached_attention(ctx, qkv, c);
    return linear_proj.forward(ctx, c);
  }
  Tensor lse = Tensor::empty({ctx.batch, heads, ctx.seq}, DType::F32, dev);
  Tensor probs;
  const int C = cp_.size();
  const bool ring = C > 1 && cp_.comm == CpCommTypeId::p2p;
  // The ring recomputes the scores in backward (flash-attention style): no probabilities kept.
  // Neither does a GPU: there the backward's recomputation costs less than writing and reading
  // [batch, heads, seq, seq] probabilities (the CPU's backward is faster reading them).
  if (ctx.save && !ctx.recompute_core_attention && !ring && !dev.is_cuda())
    probs = Tensor::empty({ctx.batch, heads, ctx.seq, C * ctx.seq}, DType::F32, dev);
  const ops::DropoutSpec drop = ctx.dropout(attention_dropout, layer, kSiteAttentionProbs);
  if (ring) {
    ring_attention_fwd(cp_, c, lse, qkv, mask(ctx), sh, drop);
  } else if (C > 1) {
    allgather_attention_fwd(cp_, c, lse, probs, qkv, mask(ctx), sh, drop);
  }
  Tensor operand;  // the single-rank attention's operands (bf16 for a bf16 model)
  if (!ring && C == 1) {
    operand = attention_operand(qkv, linear_qkv.weight.param.value.dtype());
    ops::attention_fwd(c, lse, probs, inputs(ctx, operand, sh), mask(ctx), sh, drop);
  }
  Tensor y = linear_proj.forward(ctx, c);
  if (ctx.save) {
    qkv_ = operand.defined() && model::keeps_operand(qkv) ? operand : qkv;
    lse_ = lse;
    probs_ = probs;
    ctx_ = c;
  }
  return y;
}

Tensor SelfAttention::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(qkv_.defined(), "SelfAttention::backward without a saved forward");
  Tensor dc = linear_proj.backward(ctx, dy);
  const ops::DropoutSpec drop = ctx.dropout(attention_dropout, layer, kSiteAttentionProbs);
  const ops::AttentionShape sh = shape(ctx);
  Tensor dqkv;
  const int C = cp_.size();
  if (C > 1 && cp_.comm == CpCommTypeId::p2p) {
    dqkv = ring_attention_bwd(cp_, dc, qkv_, ctx_, lse_, mask(ctx), sh, drop);
  } else if (C > 1) {
    dqkv = allgather_attention_bwd(cp_, dc, qkv_, ctx_, lse_, probs_, mask(ctx), sh, drop);
  } else {
    dqkv = Tensor::empty(qkv_.get().shape(), DType::F32, dc.device());
    const Tensor operand = attention_operand(qkv_, linear_qkv.weight.param.value.dtype());
    const ops::AttentionInputs in = inputs(ctx, operand, sh);
    Tensor dbias;
    if (in.bias.defined()) dbias = Tensor::empty(in.bias.shape(), DType::F32, dc.device());
    ops::attention_bwd({dqkv, dqkv, dqkv, dbias}, dc, ctx_, lse_, probs_, in, mask(ctx), sh,
                       drop);
    if (dbias.defined()) {  // every layer of the block adds its part
      MG_CHECK(ctx.attention_bias_grad.shape() == dbias.shape(),
               "SelfAttention: no gradient buffer for the relative position bias");
      ops::add(ctx.attention_bias_grad, ctx.attention_bias_grad, dbias);
    }
  }
  qkv_.reset();
  lse_.reset();
  probs_.reset();
  ctx_.reset();
  if (spec_.rope) ops::rope_bwd(dqkv, ctx.rope_positions, sh, rope_);
  if (q_layernorm) qk_norm_backward(ctx, dqkv);
  return linear_qkv.backward(ctx, dqkv);
}

}  // namespace megatron::model
