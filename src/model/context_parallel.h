// Context parallelism (--context-parallel-size C; Megatron's CP with causal load balancing):
// every sample's sequence of S tokens is cut into 2C chunks of S/(2C) and CP rank r holds chunks
// r and 2C-1-r (in that order), so every rank gets the same share of the causal attention work.
// Tokens, labels, loss mask, position ids and attention starts are sliced that way
// (slice_for_context_parallel in gpt_model.h); all non-attention layers run unchanged on the
// local S/C tokens, with dropout masks taken by each token's position in the unsplit tensors
// (LayerContext::for_each_sequence_run), so training matches the unsplit run, dropout included.
//
// Attention needs every earlier key; two exchanges give the same result (--cp-comm-type):
// - "p2p" (the default, as in Megatron): a ring. Each rank keeps its queries and passes the
//   packed key/value block of its tokens to the next rank C-1 times; at every step it computes
//   its queries against the block it holds (ops::attention_block_fwd: only the part of the block
//   the causal mask lets through, half of it for every block but its own) while the next block
//   is in flight, and merges the partial softmaxes (online softmax, ops::attention_merge). The
//   backward runs the ring again: dQ stays, and each block's dK / dV accumulator travels with it
//   and arrives at its owner after the last step. Score memory per rank: one [S/C, S/C] block.
// - "allgather": the forward all-gathers the QKV activation of the CP group and puts it back in
//   sequence order, and each rank computes its own query rows against the whole sequence
//   (ops::attention_subset_fwd: causal mask and --reset-attention-mask starts by global
//   position, dropout masks those of the unsplit attention). The backward gathers QKV again (only
//   the local [b*S/C, width] is kept between forward and backward), computes dQ for its rows and
//   its queries' contributions to dK / dV of every position, and reduce-scatters them back to the
//   ranks that own those positions. Score memory per rank is [S/C, S].
//
// Gradients of the parameters are partial sums over this rank's tokens: the trainer sums them
// over the data x context parallel group (Megatron's data_parallel_group_with_cp), and the loss
// sums and token counts over the same group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace megatron::model {

// --cp-comm-type: how attention exchanges keys and values across the group.
enum class CpCommType { P2P, AllGather };
// "p2p" or "allgather"; Megatron's "a2a" and "a2a+p2p" (head all-to-all) throw Error saying they
// are not implemented.
CpCommType parse_cp_comm_type(const std::string& name);

// The context-parallel group a model runs in.
struct ContextParallel {
  std::shared_ptr<Communicator> group;  // never null; a group of one for C = 1
  CpCommType comm = CpCommType::P2P;

  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
  static ContextParallel none();  // a group of one, one shared instance
};

// Position in the whole sequence of local token i (0 <= i < local_seq) of CP rank `rank` of
// `size`: chunk rank for i < local_seq / 2, then chunk 2*size-1-rank. local_seq must be even
// when size > 1.
int64_t context_parallel_position(int64_t i, int64_t local_seq, int rank, int size);
// All of them: int32 [local_seq].
Tensor context_parallel_positions(int64_t local_seq, int rank, int size,
                                 Device device = Device::cpu());

// The attention exchange as a conjugate pair (see tp_mappings.h), over rows of batch-first
// [b*s, w] activations:
//   forward: all-gather of every rank's [b*S/C, w] into the whole sequence [b*S, w] in order;
//   backward: the [b*S, w] gradient summed over the group, each rank keeping its own rows.
struct GatherFromContextParallelRegion {
  static Tensor forward(const ContextParallel& cp, const Tensor& local, int64_t batch);
  static Tensor backward(const ContextParallel& cp, const Tensor& dfull, int64_t batch);
};

// --cp-comm-type p2p: this rank's queries against the whole sequence by the ring exchange.
// qkv [b*S/C, width] is this rank's fused QKV activation (chunks rank and 2C-1-rank),
// attention_start [b, S/C] or undefined; shape is the local one (seq = S/C, kv_seq unused).
// Writes ctx [b*S/C, n*d] and lse [b, n, S/C].
void ring_attention_fwd(const ContextParallel& cp, const Tensor& ctx, const Tensor& lse,
                        const Tensor& qkv, const Tensor& attention_start,
                        const ops::AttentionShape& shape, const ops::DropoutSpec& dropout);
// The backward from the forward's qkv, ctx and lse: returns dqkv [b*S/C, width] (dQ of this
// rank's queries, dK / dV of its keys and values from every rank's queries).
Tensor ring_attention_bwd(const ContextParallel& cp, const Tensor& dctx, const Tensor& qkv,
                          const Tensor& ctx, const Tensor& lse, const Tensor& attention_start,
                          const ops::AttentionShape& shape, const ops::DropoutSpec& dropout);

}  // namespace megatron::model
