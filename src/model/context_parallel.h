// Context parallelism (--context-parallel-size C; Megatron's CP with causal load balancing):
// every sample's sequence of S tokens is cut into 2C chunks of S/(2C) and CP rank r holds chunks
// r and 2C-1-r (in that order), so every rank gets the same share of the causal attention work.
// Tokens, labels, loss mask, position ids and attention starts are sliced that way
// (slice_for_context_parallel in model_chunk.h); all non-attention layers run unchanged on the
// local S/C tokens, with dropout masks taken by each token's position in the unsplit tensors
// (LayerContext::for_each_sequence_run), so training matches the unsplit run, dropout included.
//
// Attention needs the keys of the whole sequence; both exchanges prepare them for the one core
// attention op (ops::attention_fwd / attention_bwd), with this rank's queries at their positions in
// the whole sequence, so every mask (causal, document resets, sliding windows, ALiBi,
// bidirectional with key padding) and every dropout mask is that of the unsplit attention
// (--cp-comm-type):
// - "p2p" (the default, as in Megatron): a ring. Each rank keeps its queries and passes the
//   packed key/value block of its tokens to the next rank C-1 times; at every step it computes
//   its queries against the block it holds (with the block's key positions: for causal attention
//   only the part the mask lets through, half of it for every block but its own) while the next
//   block is in flight, and merges the partial softmaxes (online softmax, ops::attention_merge).
//   The backward runs the ring again: dQ stays, and each block's dK / dV accumulator travels with
//   it and arrives at its owner after the last step. Score memory per rank: one tile per thread.
// - "allgather": the forward all-gathers the packed key/value columns of the group's QKV and puts
//   them in sequence order, and each rank computes its own query rows against the whole sequence.
//   The backward gathers them again (only the local QKV is kept between forward and backward),
//   computes dQ for its rows and its queries' contributions to dK / dV of every position, and
//   reduce-scatters those back to the ranks that own the positions. Probabilities kept for
//   backward (no selective recompute) are [S/C, S] per head.
// A key padding mask is all-gathered in sequence order ([b, S], small) for either exchange.
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
#include "model/layer_kinds.h"

namespace megatron::model {

// --cp-comm-type (its kind table: layer_kinds.h): "p2p" or "allgather"; Megatron's "a2a" and
// "a2a+p2p" (head all-to-all) throw Error saying they are not implemented.
CpCommTypeId parse_cp_comm_type(const std::string& name);

// The context-parallel group a model runs in.
struct ContextParallel {
  std::shared_ptr<Communicator> group;  // never null; a group of one for C = 1
  CpCommTypeId comm = CpCommTypeId::p2p;  // how attention exchanges keys and values

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
// [b*s, w] activations (any dtype; the backward sums, so fp32 there):
//   forward: all-gather of every rank's [b*S/C, w] into the whole sequence [b*S, w] in order;
//   backward: the [b*S, w] gradient summed over the group, each rank keeping its own rows.
struct GatherFromContextParallelRegion {
  static Tensor forward(const ContextParallel& cp, const Tensor& local, int64_t batch);
  static Tensor backward(const ContextParallel& cp, const Tensor& dfull, int64_t batch);
};

// The attention of this rank's queries against the whole sequence, in both exchanges. qkv
// [b*S/C, width] is this rank's fused QKV activation (chunks rank and 2C-1-rank), mask the local
// one (attention_start [b, S/C], key_padding [b, S/C] or undefined), shape the local one (seq =
// S/C). Forward writes out [b*S/C, n*d] and lse [b, n, S/C] (and probs [b, n, S/C, S] when
// defined, all-gather only); backward takes the forward's out and lse and returns dqkv
// [b*S/C, width]: dQ of this rank's queries, dK / dV of its keys and values from every rank's
// queries.
void ring_attention_fwd(const ContextParallel& cp, const Tensor& out, const Tensor& lse,
                        const Tensor& qkv, const ops::AttentionMask& mask,
                        const ops::AttentionShape& shape, const ops::DropoutSpec& dropout);
Tensor ring_attention_bwd(const ContextParallel& cp, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, const ops::AttentionMask& mask,
                          const ops::AttentionShape& shape, const ops::DropoutSpec& dropout);
void allgather_attention_fwd(const ContextParallel& cp, const Tensor& out, const Tensor& lse,
                             const Tensor& probs, const Tensor& qkv,
                             const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                             const ops::DropoutSpec& dropout);
Tensor allgather_attention_bwd(const ContextParallel& cp, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& lse, const Tensor& probs,
                               const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                               const ops::DropoutSpec& dropout);

}  // namespace megatron::model
