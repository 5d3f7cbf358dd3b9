// T5 models in Megatron-LM's torch_dist checkpoints: Megatron-Core's sharded keys of T5Model and
// ours (the GPT layout is in torch_dist_checkpoint.h, the MoE keys in torch_dist_moe.h).
//
// From megatron/core/models/T5/t5_model.py (T5Model.sharded_state_dict is LanguageModule's:
// MegatronModule's default walk over named_children) and transformer_block.py:
//   embedding.word_embeddings.weight            TP chunks along the rows, as GPT's
//   embedding.position_embeddings.weight        replicated (learned_absolute)
//   {encoder,decoder}_relative_pos_emb.relative_attention_bias.weight   [buckets, heads]
//                                               replicated (a plain torch Embedding: TP rank 0's is
//                                               the main replica)
//   encoder.layers.<module>.<param>             the encoder block's layers, its own layer axis of
//                                               encoder_num_layers (num_layers)
//   decoder.layers.<module>.<param>             the decoder block's, a layer axis of
//                                               decoder_num_layers; cross_attention.linear_q and
//                                               linear_kv TP chunks along the rows (ColumnParallel),
//                                               cross_attention.linear_proj along the columns,
//                                               pre_cross_attn_layernorm replicated
//   {encoder,decoder}.final_layernorm.*         replicated
//   lm_head.output_layer.bias (tied) / .weight (untied)   TP chunks along the vocabulary; T5Model's
//                                               self.output_layer alias of the same module is not
//                                               saved again (MegatronModule's walk is named_children,
//                                               which yields a module once, under its first name),
//                                               and the optimizer's state is keyed by it too
//                                               (optimizer.state.<kind>.lm_head.output_layer.*)
//   *._extra_state/shard_<l>_<L>                ShardedObjects of each layer's modules (the
//                                               decoder's cross-attention ones too), and
//                                               lm_head.output_layer._extra_state
// A checkpoint with both encoder and decoder keys is a T5 model.
#pragma once

#include <string>
#include <vector>

#include "training/checkpoint.h"

namespace megatron::training::torch_dist_t5 {

// True when the model keys hold both an encoder and a decoder block (T5Model).
bool is_t5(const std::vector<std::string>& model_keys);

// T5Model's alias of its head's output layer ("output_layer.weight" / ".bias"), which Megatron
// does not save: true for such a key when "lm_head.<key>" is also among the keys (a file that has
// both, e.g. from a state_dict() walk, is read once).
bool is_output_alias(const std::string& key, bool has_lm_head_twin);

// The layer count of a T5 block's key ("decoder.layers." -> decoder layers, else num_layers).
int64_t block_layers(const std::string& key, const TrainingArgs& a);

// The Megatron keys a T5 tensor of ours is saved under: the head's output layer under
// "lm_head.output_layer.*" (its state too), every other tensor under its one key (`key`, from
// torch_dist_moe::sharded_key).
std::vector<std::string> keys_of(const std::string& ours, const std::string& key, bool optimizer_state);

// The _extra_state ShardedObjects of the T5 model as "<key>/shard_<l>_<L>" (each block's layers,
// the decoder's cross-attention modules included) and the head's output layer's.
std::vector<std::string> extra_state_keys(const TrainingArgs& a, bool transformer_engine);

}  // namespace megatron::training::torch_dist_t5
