// Mixture-of-experts layers in Megatron-LM's torch_dist checkpoints: Megatron-Core's sharded keys
// of an MoE layer and ours (the layout of the rest is in torch_dist_checkpoint.h).
//
// From megatron/core/transformer/moe (experts.py, moe_layer.py, router.py, shared_experts.py) and
// transformer_block.py:
//   decoder.layers.mlp.router.weight            [L, E, h]  replicated over TP (TopKRouter.weight)
//   decoder.layers.mlp.router.expert_bias       [L, E]     float32 buffer (sigmoid routing with
//                                                          --moe-router-enable-expert-bias)
//   decoder.layers.mlp.experts.experts.<module>.<param>   [L, E, ...] the experts: SequentialMLP
//       maps its local_experts.J to the global expert e = EP rank * E/EP + J on an axis after the
//       layer axis (its sharded_state_dict), and TEGroupedMLP's linear_fc1.weight<J> to the same
//       keys ("interchangeable with SequentialMLP's"); each expert's fc1 / fc2 is TP-chunked as the
//       dense MLP's (SwiGLU's [gate; up] as two chunks per TP rank); replica id (PP, TP, expert
//       data-parallel rank): the expert data-parallel rank 0 of each EP rank writes them
//   decoder.layers.mlp.shared_experts.linear_fc1/linear_fc2.*   the shared expert: a dense MLP
//   decoder.layers.mlp.shared_experts.gate_weight               [L, 1, h] replicated
//   decoder.layers.pre_mlp_layernorm.*          an MoE layer keeps its norm (not fused into fc1)
//   decoder.layers.mlp.experts.experts.linear_fc{1,2}._extra_state/shard_<l>.<e>_<L>.<E>  objects
// With --moe-layer-freq other than the integer 1 (a list, or k > 1) the block's layers are not
// homogeneous and every key holds one layer ("decoder.layers.<N>.mlp...", no layer axis).
// Our names: a layer's experts by their global numbers, SequentialExperts' mlp.experts.local_experts
// .<e>.<module>.<param> or GroupedExperts' mlp.experts.<module>.<weight|bias><e>, the form the
// reading run asks for (both are the same tensors).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "training/checkpoint.h"
#include "training/torch_dist_items.h"

namespace megatron::training::torch_dist_moe {

// True for a key of the experts' weights (".mlp.experts.experts."): an expert axis after the
// layer axis (or first, for a key of one layer).
bool is_expert_key(const std::string& key);

// Megatron-Core's singleton_local_shards form of an expert key ("...experts.experts.<e>.<module>"):
// an Error naming it (not read).
void refuse_singleton_expert_key(const std::string& key, const std::string& label);

// Our names of expert e of layer `layer` for the expert key's module part ("linear_fc1.weight"):
// {sequential, grouped}.
std::pair<std::string, std::string> expert_names(int layer, const std::string& module_param, int e);

// The router's expert_bias (a float64 state here, no weight spec, no optimizer state).
bool is_expert_bias(const std::string& ours);

// How a model's MoE layers are keyed.
struct MoeLayout {
  int experts = 0;              // num_moe_experts (0: dense)
  bool per_layer_keys = false;  // non_homogeneous_layers: one key per layer, no layer axis
  std::vector<int> moe_layer;   // per layer: 1 for an MoE layer
};
MoeLayout moe_layout(const TrainingArgs& a);

// Whether a layer's norm `sub` ("input_layernorm.weight", ...) is keyed under Transformer Engine's
// fused names (self_attention.linear_qkv.layer_norm_*, mlp.linear_fc1.layer_norm_*) in torch_dist:
// always, with both --transformer-impl values, except an MoE layer's pre-MLP norm under
// transformer_engine (pre_mlp_layernorm.*).
bool fused_norm_keys(bool transformer_engine, bool moe_layer, const std::string& sub);

// Megatron-Core's sharded key of our tensor `ours` (transformer_engine: --transformer-impl
// transformer_engine, which keys an MoE layer's pre-MLP norm apart, see fused_norm_keys), its
// global layer (-1: none, or a key of one layer) and its global expert (-1: not an expert's).
struct KeyPlace {
  std::string key;
  int layer = -1;   // the offset on the key's layer axis (-1: the key has none)
  int number = -1;  // the tensor's global layer (-1: not a layer's)
  int expert = -1;
};
KeyPlace sharded_key(const std::string& ours, bool transformer_engine, const MoeLayout& moe);

// torch_dist_io::add_chunks at a key's place: an expert's chunks get the expert axis (of E experts,
// after the layer axis) with the expert as its offset.
void add_chunks_at(std::vector<torch_dist_io::WriteItem>& items, const std::string& key, const KeyPlace& place,
                   int L, int E, const Shape& global, int dim, std::vector<std::pair<int64_t, Tensor>> chunks);

// The tensor-parallel split of tensor `ours` (our name) that `rank` holds, {rank, size}: an
// expert's over the expert tensor-parallel ranks (--expert-tensor-parallel-size, Megatron's
// expert_dist_ckpt_decorator), every other tensor's over TP.
std::pair<int, int> tensor_split(const CheckpointRank& rank, const std::string& ours);

// Whether `rank` writes the main replica of the experts' tensors: Megatron's expert
// data-parallel rank 0 (replica id (PP, expert TP, expert DP rank)).
bool writes_experts(const CheckpointRank& rank);
// Megatron's expert tensor-parallel rank of `rank` (its TP rank unless folded).
int expert_tp_rank(const CheckpointRank& rank);

// The _extra_state ShardedObjects of layer `layer` (of L) as "<key>/shard_<offsets>_<shape>": the
// dense layer's (torch_names::extra_state_names), or an MoE layer's attention modules, the
// linear_fc1 / linear_fc2 of experts [first, last) and, with `shared`, the shared expert's; `block`
// "encoder" for BertModel's layers.
std::vector<std::string> layer_extra_state_keys(int layer, int L, bool transformer_engine, const MoeLayout& moe,
                                               int first, int last, bool shared,
                                               const std::string& block = "decoder");

}  // namespace megatron::training::torch_dist_moe
