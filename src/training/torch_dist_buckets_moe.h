// Mixture-of-experts models in the distributed optimizer's dp_reshardable buckets (see
// torch_dist_buckets.h), from Megatron-Core's sources:
//   optimizer/__init__.py get_megatron_optimizer: the parameters whose `allreduce` is False (the
//       experts' under expert parallelism: their linear layers set allreduce = not (is_expert and
//       expert_model_parallel_size > 1)) get a DistributedOptimizer of their own over the model's
//       expert_parallel_buffers, its data-parallel group the expert data-parallel group and its
//       data_parallel_group_idx the rank in the expert tensor-model-pipeline group, t + T (e + EP p)
//       (tp fastest, then ep, then pp); the others keep the dense one (data_parallel_group_idx
//       t + T p). Two optimizers make a ChainedOptimizer (optimizer.py), whose sharded_state_dict
//       prefixes every key of optimizer i with "chained_<i>." (add_prefix_for_sharding) unless
//       the format is fully reshardable; a single optimizer's keys keep no prefix (EP 1: the experts
//       stay in the dense buffer). common.pt's "optimizer" is then {0: {...}, 1: {...}}.
//   distributed_data_parallel.py / param_and_grad_buffer.py: the expert buffer lays out the
//       experts' parameters as the dense one (reverse registration order, 64-element alignment),
//       its buckets padded to lcm(expert DP, 128) and split over the expert DP ranks.
//   moe_layer.py MoELayer registers router (TopKRouter.weight), experts, shared_experts;
//       experts.py SequentialMLP: local_experts.<J>.linear_fc1 / linear_fc2 expert by expert;
//       TEGroupedMLP: linear_fc1.weight0..weight<E/EP-1>, then linear_fc2's;
//       shared_experts.py SharedExpertMLP: linear_fc1, linear_fc2, then gate_weight.
#pragma once

#include <functional>
#include <string>

#include "training/checkpoint.h"

namespace megatron::training {

// Our names of an MoE layer's parameters (prefix "decoder.layers.<l>.") in Megatron-Core's
// registration order, for `experts` global experts in both our sequential and grouped forms (a
// layout keeps those its model has).
void moe_layer_registration_order(const std::string& prefix, int64_t experts,
                                  const std::function<void(const std::string&)>& add);

// True for our name of an expert's weight (sequential or grouped form).
bool is_expert_param_name(const std::string& name);

// The expert of our expert weight's name (-1: not an expert's).
int expert_of_name(const std::string& name);

// Megatron's key prefix of one distributed optimizer's dp_reshardable state on model-parallel
// rank `group_idx`: "optimizer.distributed.dp_group_idx_<g>.", with "chained_<i>." before it
// when `chained` (i: 0 dense, 1 experts).
std::string dp_reshardable_prefix(bool chained, bool experts, int64_t group_idx);

// Whether pipeline stage p (of P, L layers) of this MoE model holds experts in a buffer of their
// own: expert parallelism and an MoE layer on the stage.
bool stage_has_expert_buffer(const TrainingArgs& a, int p, int P, int ep_size);

}  // namespace megatron::training
