// T5Model (Megatron-Core's T5Model, t5_spec.py's local layer specs, pretrain_t5.py): the
// encoder-decoder family on the shared language-model machinery (language_module.h):
//   - one embedding for both sides: the word table and, with learned_absolute positions (the
//     default), the position table, read with position ids 0..s-1 of each side (t5_position_ids);
//   - the "encoder" block (num_layers layers, bidirectional self-attention under the encoder's
//     padding mask, encoder.final_layernorm) over text_enc;
//   - the "decoder" block (decoder_layers() layers: causal self-attention, then
//     pre_cross_attn_layernorm and cross-attention over the encoder's output with the encoder's
//     padding mask, then the MLP; decoder.final_layernorm) over text_dec;
//   - with --position-embedding-type relative, encoder_relative_pos_emb (bidirectional buckets)
//     and decoder_relative_pos_emb (causal buckets), each added to every self-attention score of
//     its block (cross-attention has none); with rope, rotary positions in both self-attentions;
//   - the LM head (T5LMHead): the output layer over the padded vocabulary, tied to the word table
//     with its own bias (output_layer.bias), or, with --untie-embeddings-and-output-weights, its
//     own weight and no bias (Megatron-Core's bias=share_embeddings_and_output_weights).
// Parameters in Megatron-Core's order: embedding, the two relative embeddings, encoder, decoder,
// the head.
// The loss is pretrain_t5.py's (pretrain_gpt.py's loss_func, LossReduction::sum_and_count): the
// sum of the decoder tokens' cross entropy under loss_mask and the mask's sum. Labels outside the
// loss mask may be -1 (Megatron's label padding).
// The batch (model_chunk.h): encoder_tokens and encoder_padding_mask (text_enc, enc_mask),
// tokens, labels and loss_mask (text_dec, labels, loss_mask). The decoder needs no mask of its
// own: its padding is at the end and the causal mask keeps it from the real tokens (Megatron-Core
// with Transformer Engine passes no decoder mask either).
// Generation (t5_inference.cpp): start_inference runs the encoder once and fills the decoder's
// static cross-attention cache; forward_inference then appends decoder tokens one position at a
// time with the self-attention KV cache (and, with relative positions, the decoder's causal bias
// of the cache's positions), the same layers as training.
// Parallelism: tensor parallelism with or without sequence parallelism (both blocks; under
// sequence parallelism the encoder's output stays sequence-sharded and each cross-attention's
// linear_kv gathers it, as Megatron-Core's column-parallel linear_kv does, and reduce-scatters its
// gradient back), data parallelism with the distributed optimizer, recomputation, bf16/fp16.
// Refused, each a megatron::Error naming what is supported: pipeline parallelism (Megatron-LM's
// pretrain_t5.py raises "Pipeline parallelism is not supported for T5."), context parallelism
// (Megatron-LM has none for T5), grouped-query attention (Megatron-Core's CrossAttention has
// none).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/inference_context.h"
#include "model/language_module.h"
#include "model/relative_position.h"

namespace megatron::model {

class T5Model final : public LanguageModule {
 public:
  // The whole model over a tensor-parallel group (and a context-parallel group of one).
  T5Model(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
          const ContextParallel& cp = ContextParallel::none());
  T5Model(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
          const ContextParallel& cp, const ChunkPlace& place, const ModelOptions& options = {});
  ~T5Model() override;

  // ---- ModelChunk
  ParameterList parameters() override;
  Tensor forward(int64_t microbatch, const Batch& in, const Tensor& x, const ChunkForward& opt,
                 LossResult* loss = nullptr) override;
  Tensor backward(int64_t microbatch, const Tensor& dy) override;
  int in_flight() const override { return int(in_flight_.size()); }
  const std::vector<std::string>& loss_names() const override;
  LossReduction loss_reduction() const override { return LossReduction::sum_and_count; }

  // [b, sd, padded_vocab] fp32 logits of the decoder's tokens (no dropout).
  Tensor forward_logits(const Batch& in) override;

  // ---- generation (inference_context.h)
  // Runs the encoder over encoder_tokens [b, se] int32 (encoder_padding_mask [b, se] int32, 0 at
  // padding, or undefined) and sizes `ic` for b slots (slot i: encoder row i) of up to max_len
  // decoder positions: the decoder's self-attention KV caches and, per decoder layer, the static
  // cross-attention cache (linear_kv of the encoder's output) with the encoder's padding.
  void start_inference(InferenceContext& ic, const Tensor& encoder_tokens,
                       const Tensor& encoder_padding_mask, int64_t max_len);
  // Appends decoder tokens int32 [n] to the caches at ic.row_slot / ic.row_pos (int32 [n] each,
  // set by the caller); returns the logits [k, padded_vocab] of the rows logit_rows (int32 [k]).
  Tensor forward_inference(const Tensor& tokens, InferenceContext& ic, const Tensor& logit_rows);

  TransformerBlock& encoder() { return *block_; }
  TransformerBlock& decoder() { return *decoder_; }

  // The family's checks (model_family.h).
  static void validate(const TransformerConfig& cfg);

 protected:
  std::vector<Module*> head_modules() override;
  LossResult head_loss(const LayerContext& ctx, const Tensor& xf, const Batch& in,
                       float grad_scale, Tensor* dxf) override;
  Tensor head_logits(const LayerContext& ctx, const Tensor& xf) override;
  std::vector<Module*> modules() override;
  void init_weights() override;

 private:
  struct Pass;  // one micro-batch's contexts and stashes
  // Runs both blocks over `in` (the encoder, then the decoder with its output); returns the
  // decoder's final hidden states. With ctx.save the activations go into *pass.
  Tensor run_forward(Pass& pass, const Batch& in);
  void backward_pass(Pass& pass, const Tensor& dxf_in);

  std::unique_ptr<RelativePositionEmbedding> encoder_relative_, decoder_relative_;
  std::unique_ptr<TransformerBlock> decoder_;
  std::map<int64_t, std::unique_ptr<Pass>> in_flight_;
};

// T5's layer specs (t5_spec.py's encoder_model_with_local_spec / decoder_model_with_local_spec).
TransformerLayerSpec t5_encoder_layer_spec(const TransformerConfig& cfg);
TransformerLayerSpec t5_decoder_layer_spec(const TransformerConfig& cfg);

}  // namespace megatron::model
