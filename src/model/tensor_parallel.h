// Tensor-parallel bookkeeping of a model's parameters: which tensor-parallel group a model runs
// in, how a parameter is sharded (Parameter::partition_dim), how shards are cut from and
// reassembled into the single-rank tensor, and the two rules the trainer needs:
//
//  1. Sequence parallelism: parameters marked Parameter::sequence_parallel (LayerNorm weights and
//     biases, row-parallel biases, the position embedding) are replicated across the TP group but
//     each rank only sees its sequence shard, so their gradients are partial sums. After the last
//     micro-batch's backward (before the data-parallel reduction, the grad norm and clipping),
//     all_reduce_sequence_parallel_grads() sums them over the TP group (Megatron's
//     finalize_model_grads "layernorm-grads-all-reduce").
//  2. Grad norm: a parameter replicated across TP (partition_dim < 0) holds the same gradient on
//     every TP rank, so it is counted only on TP rank 0 (Megatron's
//     param_is_not_tensor_parallel_duplicate); sharded parameters count on every rank. A pipeline
//     replica (Parameter::shared: the last stage's tied embedding copy) is never counted (Megatron's
//     param_is_not_shared). The global norm is sqrt of the SUM-all-reduce of the local sums over
//     the model-parallel (tp-pp) group.
//
// Shard layout (checkpoints, resharding): a sharded parameter's shard on TP rank r of T is chunk
// r of T equal chunks along partition_dim of the single-rank tensor with the same name, so
// resharding is a plain split / concatenation along that dim. linear_qkv is stored in
// Megatron-Core's interleaved layout (per query group: its query heads, then its key head, then
// its value head), so a dim-0 chunk is exactly the whole query groups [r*g/T, (r+1)*g/T) and
// their heads. The word embedding (and the tied output layer) is split along the padded vocab,
// which Megatron pads to a multiple of make_vocab_size_divisible_by * T: changing T may change the
// padded size, and a converter re-pads the table before splitting.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "model/parameter.h"

namespace megatron::model {

// The tensor-parallel group a model or layer runs in.
struct TensorParallel {
  std::shared_ptr<Communicator> group;  // never null; a group of one for TP = 1
  bool sequence_parallel = false;       // only ever true when group->size() > 1
  // The MoE layers' expert-parallel group (ParallelState's "ep"; Megatron's parallel folding: the
  // experts' own mesh beside attention's): each member owns num_experts / size consecutive
  // experts and tokens travel to them (model/moe/token_dispatcher.h). Null: EP = 1.
  std::shared_ptr<Communicator> expert_parallel;
  int ep_size() const { return expert_parallel ? expert_parallel->size() : 1; }
  int ep_rank() const { return expert_parallel ? expert_parallel->rank() : 0; }
  // Megatron's explicit_expert_comm: the experts of an MoE layer under sequence parallelism hold
  // their tensor-parallel shards, but their linear layers communicate nothing; the token
  // dispatcher gathers their input rows over the group and reduce-scatters their partial outputs
  // (model/moe/token_dispatcher.h).
  bool explicit_expert_comm = false;
  // --expert-tensor-parallel-size other than the tensor-parallel size: the experts' own
  // tensor-parallel group (ParallelState's "etp"); null: `group`.
  std::shared_ptr<Communicator> expert_tensor_parallel;
  // The tensor parallelism the experts' weights are sharded by (`group`, or the expert one).
  TensorParallel experts() const;

  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
  Communicator& comm() const { return *group; }
  // A group of one (no tensor parallelism); one shared instance.
  static TensorParallel none();
  // `group` with sequence parallelism requested; it is switched off for a group of one
  // (Megatron silently disables --sequence-parallel at TP = 1).
  static TensorParallel make(std::shared_ptr<Communicator> group, bool sequence_parallel);
};

// Megatron's `tensor_model_parallel` attribute: the parameter is a shard (differs across TP).
inline bool is_tensor_model_parallel(const Parameter& p) { return p.partition_dim >= 0; }
// Megatron's param_is_not_tensor_parallel_duplicate: count this parameter in the grad norm (and
// other sums over the model-parallel group) on this TP rank.
inline bool param_is_not_tensor_parallel_duplicate(const Parameter& p, int tp_rank) {
  return is_tensor_model_parallel(p) || tp_rank == 0;
}
// Rule 2 whole: the parameter's gradient counts in sums over the model-parallel group (grad norm,
// zeros in grad) on this TP rank: not a TP duplicate and not a pipeline replica (Megatron's
// param_is_not_shared and param_is_not_tensor_parallel_duplicate).
inline bool param_counts_in_grad_norm(const Parameter& p, int tp_rank) {
  return !p.shared && param_is_not_tensor_parallel_duplicate(p, tp_rank);
}

// Shape of the single-rank tensor of which `p` is one of `tp_size` shards.
Shape full_shape(const Parameter& p, int tp_size);
// Chunk `rank` of `size` equal chunks of `full` along `dim` (contiguous copy; `full` itself when
// dim < 0 or size == 1). Error if the dimension is not divisible. With parts > 1 the dimension is
// `parts` blocks and the shard is the rank's chunk of each block, concatenated
// (Parameter::partition_parts).
Tensor shard_along(const Tensor& full, int dim, int rank, int size, int parts = 1);
// This rank's shard of the single-rank tensor of parameter `p` (its partition dim and parts).
Tensor shard_parameter(const Tensor& full, const Parameter& p, int rank, int size);
// The single-rank tensor reassembled from every rank's `local` shard along `dim` (all-gather
// over `tp`; `local` itself when dim < 0 or the group has one rank). Collective over `tp`.
Tensor gather_along(Communicator& tp, const Tensor& local, int dim);

// Sums the gradients of all Parameter::sequence_parallel parameters over `tp` (one coalesced
// all-reduce). No-op for a group of one. Collective over `tp`.
void all_reduce_sequence_parallel_grads(const ParameterList& params, Communicator& tp);
// This rank's share of the squared global L2 grad norm: sum of squares of the gradients of the
// parameters that count on `tp_rank` (param_counts_in_grad_norm). All-reduce (SUM) it over the
// model-parallel group and take the square root for the global norm.
double local_grad_sum_of_squares(const ParameterList& params, int tp_rank);

}  // namespace megatron::model
