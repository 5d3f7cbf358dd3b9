// Self-attention (Megatron-Core's SelfAttention with the local core attention):
//   qkv = linear_qkv(x)                      fused [N, g*(n/g+2)*d], Megatron-Core's layout
//   q, k <- q_layernorm(q), k_layernorm(k)   per head, with --qk-layernorm
//   q, k <- rotary(q, k; position)           with rotary position embeddings
//   ctx = softmax(scale * q k^T + mask [+ ALiBi] [+ bias]) v   ops::attention_fwd: causal or bidirectional,
//                                            optional window, key padding, document resets;
//                                            bias: LayerContext::attention_bias (T5's relative)
//   y = linear_proj(ctx)                     returned without its bias (bias-dropout-add adds it)
// Tensor parallelism: this rank holds g/T query groups with their n/T heads (linear_qkv is
// column-parallel: its dim-0 shard is whole query groups), linear_proj is row-parallel.
// Context parallelism (context_parallel.h): queries are this rank's tokens, keys and values the
// whole sequence, passed round a ring (p2p) or gathered over the group.
// Inference (ctx.inference set): each token's key and value are appended to the layer's KV cache
// at its slot and position, and its query attends the cached keys of its slot (the same op with
// the cache as keys and values; no dropout, nothing saved). A relative position bias is then
// LayerContext::attention_bias over the cache's positions, [1, heads, max_len, max_len].
#pragma once

#include <memory>
#include <string>

#include "model/layer_spec.h"
#include "model/module.h"
#include "model/norm.h"
#include "model/parallel_layers.h"
#include "model/transformer_config.h"

namespace megatron::model {

// The core attention op's geometry for this rank's `heads` (in `groups` query groups; heads
// [head_offset, head_offset + heads) of the layer's total_heads) over the context's batch and
// sequence, scaled by 1/sqrt(head_dim).
ops::AttentionShape local_attention_shape(const LayerContext& ctx, int heads, int groups,
                                          int head_dim, int head_offset, int total_heads);

class SelfAttention : public Module {
 public:
  // `layer`: the global layer number (dropout streams, the KV cache). grad: allocate gradients.
  SelfAttention(const std::string& prefix, const TransformerConfig& cfg, const AttentionSpec& spec,
                int layer, const TensorParallel& tp = TensorParallel::none(),
                const ContextParallel& cp = ContextParallel::none(), bool grad = true);
  // x and the result are [N, h], or [N/T, h] under sequence parallelism.
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // -> without proj bias
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx

  ColumnParallelLinear linear_qkv;
  std::unique_ptr<Norm> q_layernorm, k_layernorm;  // --qk-layernorm
  RowParallelLinear linear_proj;
  int heads, groups, head_dim;           // this rank's heads and query groups
  int head_offset, total_heads;          // first global head held here; the layer's heads
  int layer;
  float attention_dropout;

 private:
  ops::AttentionShape shape(const LayerContext& ctx) const;
  ops::AttentionMask mask(const LayerContext& ctx) const;
  ops::AttentionInputs inputs(const LayerContext& ctx, const Tensor& qkv,
                              const ops::AttentionShape& sh) const;
  // Inference: attention of qkv's rows against the layer's KV cache, into out.
  void cached_attention(const LayerContext& ctx, const Tensor& qkv, const Tensor& out) const;
  // Rows of the [N * g * (n/g+2), d] view of fused QKV that hold query (or key) heads.
  const Tensor& head_rows(int64_t n, bool keys, Device device);
  void qk_norm_forward(const LayerContext& ctx, const Tensor& qkv);
  void qk_norm_backward(const LayerContext& ctx, const Tensor& dqkv);

  AttentionSpec spec_;
  ops::RotaryConfig rope_;
  int64_t window_left_, window_right_;
  ContextParallel cp_;
  Tensor q_rows_, k_rows_;  // cached head_rows index tensors
  SavedTensor qkv_{this, "qkv", "[N, g*(n/g+2)*d] linear_qkv output (normed, rotated)"};
  SavedTensor lse_{this, "lse", "[b, n, s] softmax log-sum-exp"};
  // [b, n, s, s] softmax probabilities ([b, n, s, C*s] under context parallelism with the
  // all-gather); empty under selective recompute and with the CP ring (recomputed by blocks).
  // The backward reads ctx_ as well (the softmax gradient's rowsum(dctx * ctx)).
  SavedTensor probs_{this, "probs", "[b, n, s, s] (not kept under selective recompute)"};
  SavedTensor ctx_{this, "ctx", "[N, n*d] input of linear_proj"};
};

}  // namespace megatron::model
