// The distributed optimizer's dp_reshardable buckets (torch_dist_buckets.h) of BERT and T5 models:
// Megatron-Core's parameter registration order per model family, which the gradient buffer walks
// in reverse (param_and_grad_buffer.py), next to GPTModel's (megatron_buffer_layout).
//
// BertModel (megatron/core/models/bert/bert_model.py __init__; LanguageModelEmbedding,
// BertLMHead, Pooler; ColumnParallelLinear registers weight before bias):
//   embedding.word_embeddings, .position_embeddings (learned_absolute), .tokentype_embeddings
//   (first stage); encoder.layers.<l>.* as GPT's layers (the local or Transformer Engine order of
//   bert_layer_specs.py: TELayerNormColumnParallelLinear fuses input_layernorm into linear_qkv
//   and pre_mlp_layernorm into linear_fc1, registered before their weights); then, on the last
//   stage, encoder.final_layernorm, lm_head.dense, lm_head.layer_norm, output_layer.weight (untied,
//   or the tied embedding's copy on a later stage than the embedding: shared_embedding, a bucket
//   of its own), output_layer.bias, binary_head, pooler.dense (the binary head is built before
//   the pooler).
// T5Model (megatron/core/models/T5/t5_model.py __init__, t5_spec.py): embedding,
//   encoder_relative_pos_emb, decoder_relative_pos_emb (relative position bias), encoder (layers,
//   final_layernorm), decoder (layers, final_layernorm), lm_head.output_layer (weight when untied,
//   bias when tied; T5Model's output_layer alias is the same parameters, counted once). A decoder
//   layer (transformer_layer.py TransformerLayer: input_layernorm, self_attention,
//   pre_cross_attn_layernorm, cross_attention, pre_mlp_layernorm, mlp) registers its cross
//   attention's linear_proj before linear_q and linear_kv (Attention.__init__ builds linear_proj,
//   then CrossAttention its own); with Transformer Engine's spec pre_cross_attn_layernorm stays a
//   norm of its own (TENorm) and the cross-attention linears have no fused norm. T5 trains without
//   pipeline stages (pretrain_t5.py), so its tied embedding never has a bucket of its own.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/layer_kinds.h"
#include "training/torch_dist_buckets.h"

namespace megatron::training {

// What the gradient-buffer layout of a model depends on besides the shapes.
struct BufferModel {
  model::ModelFamilyId family = model::ModelFamilyId::gpt;
  int64_t layers = 0;          // GPT and BERT: num_layers; T5: the encoder's
  int64_t decoder_layers = 0;  // T5 only
  bool tied = true;            // the output layer shares the word embedding
  bool transformer_engine = false;
  int64_t experts = 0;          // GPT: --num-experts (the MoE layers' parameters too)
};

// One parameter of a BERT or T5 pipeline rank in named_parameters() order (our names); tied_copy:
// the last stage's copy of the tied word embedding.
struct OrderedParam {
  std::string name;
  bool tied_copy = false;
};
std::vector<OrderedParam> family_parameter_order(const BufferModel& m, int p, int P);

// Pipeline rank p's gradient buffer (see megatron_buffer_layout) for any family: GPT's through
// megatron_buffer_layout, BERT's and T5's from family_parameter_order.
// With V > 1 virtual stages, model chunk v's buffer (GPT only).
std::vector<BufferBucket> model_buffer_layout(const BufferModel& m,
                                              const std::function<std::optional<Shape>(const std::string&)>& local,
                                              int p, int P, int64_t DP, int64_t bucket_size,
                                              std::set<std::string>* placed = nullptr, int v = 0, int V = 1);

}  // namespace megatron::training
