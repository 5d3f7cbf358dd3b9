// BertModel (Megatron-Core's BertModel, bert_lm_head.py, pooler.py): the encoder family on the
// shared language-model machinery (language_module.h):
//   - embedding: word table, learned positions (position ids 0..s-1), and two token types when
//     the binary head is on (pretrain_bert.py's num_tokentypes = 2 if --bert-binary-head else 0);
//   - the "encoder" block: the GPT layer spec with bidirectional attention under the padding mask
//     (bert_layer_local_spec: AttnMaskType.padding), ending with encoder.final_layernorm;
//   - the masked-LM head: lm_head.dense (h -> h), exact GeLU, lm_head.layer_norm, then the output
//     layer over the vocabulary with its own bias (output_layer.bias), its weight tied to the word
//     table unless --untie-embeddings-and-output-weights;
//   - with the binary head: pooler.dense + tanh on each sequence's first token, and
//     binary_head (h -> 2).
// Loss, as pretrain_bert.py's loss_func (LossReduction::microbatch_mean): "lm loss" = sum of the
// masked tokens' cross entropy / their count, plus, with the binary head, "sop loss" = the mean
// cross entropy of the sentence-order logits over sequences whose label is not -1. The
// micro-batch's loss is their sum. A micro-batch without masked tokens (or sentence labels)
// contributes zero to that term instead of Megatron's division by zero.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/language_module.h"

namespace megatron::model {

class BertModel final : public LanguageModule {
 public:
  // The whole model over tensor- and context-parallel groups (each a group of one when unused).
  // The configuration must be a BERT one (model_family "bert", bidirectional attention).
  BertModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
            const ContextParallel& cp);
  // One chunk of a pipeline.
  BertModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
            const ContextParallel& cp, const ChunkPlace& place, const ModelOptions& options = {});
  ~BertModel() override;

  const std::vector<std::string>& loss_names() const override;
  LossReduction loss_reduction() const override { return LossReduction::microbatch_mean; }

  // [b, 2] sentence-order logits of a whole model's forward (no dropout); needs the binary head.
  Tensor forward_binary_logits(const Batch& in);

  // The family's checks (model_family.h): bidirectional attention, learned absolute or rotary
  // positions, no sliding window.
  static void validate(const TransformerConfig& cfg);

 protected:
  std::vector<Module*> head_modules() override;
  LossResult head_loss(const LayerContext& ctx, const Tensor& xf, const Batch& in,
                       float grad_scale, Tensor* dxf) override;
  Tensor head_logits(const LayerContext& ctx, const Tensor& xf) override;

 private:
  struct Heads;
  // The sentence-order logits [b, 2] of the final hidden states xf (this rank's rows); with
  // dxf, the gradient of grad_scale * the sentence-order loss is added into *dxf, and *loss gets
  // that loss's sum and count.
  Tensor binary_logits(const LayerContext& ctx, const Tensor& xf, const Tensor& labels,
                       float grad_scale, Tensor* dxf, LossTerm* loss);
  std::unique_ptr<Heads> heads_;
};

// BERT's layer spec: the GPT layer with bidirectional (padding-masked) self-attention.
TransformerLayerSpec bert_layer_spec(const TransformerConfig& cfg);

}  // namespace megatron::model
