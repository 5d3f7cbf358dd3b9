// GPTModel (Megatron-Core's GPTModel(pre_process, post_process)): the decoder-only family on the
// shared language-model machinery (language_module.h): embedding, the "decoder" block of layers
// from the GPT layer spec (layer_spec.h; GPT-2-style and Llama-style models are the same class),
// and the loss head: final norm (the block's), output layer, vocab-parallel cross entropy. The
// loss is sum(loss * mask) with its token count (LossReduction::sum_and_count, as pretrain_gpt.py).
// Parameter names and shapes follow Megatron-Core (embedding.word_embeddings.weight,
// decoder.layers.{i}.self_attention.linear_qkv.weight, ..., decoder.final_layernorm.weight,
// output_layer.weight; decoder layers keep their global numbers in every chunk). Logits span the
// padded vocabulary. The loss head runs in row chunks (one [chunk, V/T] logits buffer turned into
// dlogits in place), so the full [b*s, V] logits are never materialised in training.
// Inference: forward_inference runs the same layers with a KV cache (inference_context.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/parallel_state.h"
#include "model/language_module.h"

namespace megatron::model {

struct InferenceContext;

class GPTModel final : public LanguageModule {
 public:
  // The whole model on one rank, or over a tensor-parallel group, or over tensor- and
  // context-parallel groups (each a group of one when unused). Collective over the groups.
  GPTModel(const TransformerConfig& cfg, uint64_t seed);
  GPTModel(const TransformerConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group);
  GPTModel(const TransformerConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group,
           std::shared_ptr<Communicator> cp_group);
  GPTModel(const TransformerConfig& cfg, uint64_t seed, const ParallelState& parallel)
      : GPTModel(cfg, seed, parallel.group_ptr(GroupKind::TP), parallel.group_ptr(GroupKind::CP)) {}
  // One chunk of a pipeline (or, with the default ChunkPlace, the whole model). cfg.num_layers is
  // the whole model's and must equal place.layout.num_layers.
  GPTModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
           const ContextParallel& cp, const ChunkPlace& place, const ModelOptions& options = {});

  const std::vector<std::string>& loss_names() const override;
  LossReduction loss_reduction() const override { return LossReduction::sum_and_count; }

  // Generation: tokens int32 [n] are appended to the KV cache at inference.row_slot /
  // inference.row_pos (int32 [n] each, set by the caller); returns the logits [k, V] of the rows
  // listed in logit_rows (int32 [k]). All of them on device(). The whole model without tensor or
  // context parallelism.
  Tensor forward_inference(const Tensor& tokens, InferenceContext& inference,
                           const Tensor& logit_rows);
  // Sizes `inference`'s caches for this model: `slots` sequences of up to `max_len` positions.
  void allocate_inference(InferenceContext& inference, int64_t slots, int64_t max_len) const;

 protected:
  std::vector<Module*> head_modules() override;
  LossResult head_loss(const LayerContext& ctx, const Tensor& xf, const Batch& in,
                       float grad_scale, Tensor* dxf) override;
  Tensor head_logits(const LayerContext& ctx, const Tensor& xf) override;
};

}  // namespace megatron::model
