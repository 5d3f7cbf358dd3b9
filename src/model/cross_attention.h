// Cross-attention (Megatron-Core's CrossAttention with the local core attention), the attention of
// an encoder-decoder's decoder layer over the encoder's output:
//   q  = linear_q(x)                  [Nq, n*d]    from the layer's (normed) input
//   kv = linear_kv(context)           [Nk, n*2*d]  per head its key then its value (Megatron's
//                                                  [sk, b, np, 2*hn] view of linear_kv's output)
//   c  = softmax(q k^T / sqrt(d) + key padding) v   ops::attention_fwd, bidirectional, no bias
//   y  = linear_proj(c)               returned without its bias (bias-dropout-add adds it)
// Megatron-Core has no grouped-query cross-attention: every head has its own key and value.
// The context and its padding mask come with the LayerContext (context, context_padding); the
// gradient of the context is ADDED into ctx.context_grad, since every decoder layer reads it.
// Tensor parallelism: linear_q and linear_kv are column-parallel (this rank's n/T heads),
// linear_proj row-parallel, as in self-attention. Under sequence parallelism the context is this
// rank's [Nk/T, h] shard of the encoder's output: linear_kv all-gathers it (and reduce-scatters
// d(context) back to the shard), as Megatron-Core's column-parallel linear_kv does.
// Generation (ctx.inference set): the keys and values are the static cross-attention cache
// (InferenceContext::cross_kv, linear_kv of the encoder output computed once by context_kv);
// each row's query attends its slot's encoder positions under the slot's padding. Nothing saved.
#pragma once

#include <string>

#include "model/module.h"
#include "model/parallel_layers.h"
#include "model/transformer_config.h"

namespace megatron::model {

class CrossAttention : public Module {
 public:
  // `layer`: the global layer number (dropout streams).
  CrossAttention(const std::string& prefix, const TransformerConfig& cfg, int layer,
                 const TensorParallel& tp = TensorParallel::none(), bool grad = true);
  // x [N, h] (the decoder's rows) -> [N, h], without linear_proj's bias.
  Tensor forward(const LayerContext& ctx, const Tensor& x);
  // -> dx; d(context) is added into ctx.context_grad.
  Tensor backward(const LayerContext& ctx, const Tensor& dy);
  // linear_kv of a context [rows, h]: the layer's entry of the cross-attention cache.
  Tensor context_kv(const LayerContext& ctx, const Tensor& context) {
    return linear_kv.forward(ctx, context);
  }

  ColumnParallelLinear linear_q, linear_kv;
  RowParallelLinear linear_proj;
  int heads, head_dim, head_offset, total_heads, layer;
  int context_shards;  // T under sequence parallelism (the context is a row shard), else 1
  float attention_dropout;

 private:
  ops::AttentionShape shape(const LayerContext& ctx) const;
  ops::AttentionMask mask(const LayerContext& ctx) const;
  ops::AttentionInputs inputs(const Tensor& q, const Tensor& kv, const LayerContext& ctx) const;
  Tensor cached_forward(const LayerContext& ctx, const Tensor& x);

  SavedTensor q_{this, "q", "[Nq, n*d] linear_q output"};
  SavedTensor kv_{this, "kv", "[Nk, n*2*d] linear_kv output"};
  SavedTensor lse_{this, "lse", "[b, n, sq] softmax log-sum-exp"};
  SavedTensor probs_{this, "probs", "[b, n, sq, sk] (not kept under selective recompute)"};
  SavedTensor ctx_{this, "ctx", "[Nq, n*d] input of linear_proj"};
};

}  // namespace megatron::model
