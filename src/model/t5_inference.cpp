// T5Model's generation entries (see t5_model.h): the encoder once per batch, then the decoder one
// position at a time over its KV cache and the static cross-attention cache.
#include <vector>

#include "kernels/ops.h"
#include "model/t5_model.h"

namespace megatron::model {

void T5Model::start_inference(InferenceContext& ic, const Tensor& encoder_tokens,
                              const Tensor& encoder_padding_mask, int64_t max_len) {
  MG_CHECK(cp_.size() == 1 && !tp_.sequence_parallel,
           "T5Model::start_inference runs without context or sequence parallelism");
  MG_REQUIRE(encoder_tokens.defined() && encoder_tokens.dim() == 2 &&
                 encoder_tokens.dtype() == DType::I32 && encoder_tokens.numel() > 0,
             "T5 generation needs the encoder's tokens as a non-empty int32 [batch, seq] tensor");
  MG_REQUIRE(max_len >= 1 && (!cfg_.learned_position_embedding() ||
                              max_len <= cfg_.max_position_embeddings),
             "decoder length ", max_len, " exceeds max_position_embeddings ",
             cfg_.max_position_embeddings, " (the position table T5's decoder shares)");
  const int64_t b = encoder_tokens.size(0), se = encoder_tokens.size(1);
  // ---- the encoder, as in training (no dropout, nothing saved)
  Batch eb;
  eb.tokens = encoder_tokens;
  std::vector<int32_t> pos(size_t(b * se));
  for (int64_t i = 0; i < b * se; ++i) pos[size_t(i)] = int32_t(i % se);
  eb.position_ids = Tensor::from_vector(pos, {b, se}, device_);
  LayerContext ectx = make_ctx(eb, false, false, 0);
  Tensor padding;
  if (encoder_padding_mask.defined()) {
    MG_REQUIRE(encoder_padding_mask.dtype() == DType::I32 &&
                   encoder_padding_mask.shape() == encoder_tokens.shape(),
               "the encoder's padding mask must be int32 with the tokens' shape ",
               shape_str(encoder_tokens.shape()));
    padding = encoder_padding_mask.contiguous();
    ectx.key_padding = padding;
  }
  if (encoder_relative_) {
    hooks_.before_forward(*encoder_relative_);
    ectx.attention_bias = encoder_relative_->forward(se, se, device_);
    hooks_.after_forward(*encoder_relative_);
  }
  Tensor x = block_->forward(ectx, embed(ectx, eb), nullptr);
  const Tensor encoded = block_->final_norm_forward(ectx, x);
  // ---- the decoder's caches: self-attention keys/values, and the cross-attention keys/values
  // of every decoder layer from the encoder's output (computed once here)
  const int first = decoder_->first_layer(), layers = first + decoder_->num_layers();
  ic.allocate(layers, b, cfg_.num_attention_heads / tp_.size(), max_len, cfg_.head_dim(), device_,
              first, cache_dtype_for(cfg_.params_dtype, device_));
  ic.cross_kv.assign(size_t(layers), Tensor());
  for (int i = 0; i < decoder_->num_layers(); ++i) {
    TransformerLayer& layer = decoder_->layer(i);
    hooks_.before_forward(layer);
    ic.cross_kv[size_t(layer.index)] = layer.cross_attention->context_kv(ectx, encoded);
    hooks_.after_forward(layer);
  }
  ic.cross_seq = se;
  ic.cross_padding = padding.defined()
                         ? padding
                         : Tensor::from_vector(std::vector<int32_t>(size_t(b * se), 1), {b, se},
                                               device_);
}

Tensor T5Model::forward_inference(const Tensor& tokens, InferenceContext& ic,
                                  const Tensor& logit_rows) {
  const int64_t n = tokens.numel();
  MG_CHECK(tokens.dtype() == DType::I32 && ic.row_slot.numel() == n && ic.row_pos.numel() == n,
           "T5Model::forward_inference: ", n, " tokens need as many slots and positions");
  MG_CHECK(ic.cross_seq > 0, "T5Model::forward_inference before start_inference");
  LayerContext ctx;
  ctx.batch = 1;
  ctx.seq = n;
  ctx.seed = seed_;
  ctx.inference = &ic;
  if (cfg_.rope()) ctx.rope_positions = ic.row_pos;
  if (decoder_relative_) {  // the causal bias of every (query, key) position of the cache
    hooks_.before_forward(*decoder_relative_);
    ctx.attention_bias = decoder_relative_->forward(ic.max_len, ic.max_len, device_);
    hooks_.after_forward(*decoder_relative_);
  }
  Batch in;
  in.tokens = tokens.view({1, n});
  in.position_ids = ic.row_pos.view({1, n});
  const Tensor x = decoder_->forward(ctx, embed(ctx, in), nullptr);
  Tensor picked = Tensor::empty({logit_rows.numel(), x.size(1)}, DType::F32, x.device());
  ops::index_select_rows(picked, x, logit_rows);
  return head_logits(ctx, decoder_->final_norm_forward(ctx, picked));
}

}  // namespace megatron::model
