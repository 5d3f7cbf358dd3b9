// The local token dispatcher (Megatron-Core's MoEAllGatherTokenDispatcher at one rank): permutes
// a micro-batch's token rows into expert-major order (expert 0's tokens, then expert 1's, ...,
// each in token order, as moe_utils.permute does) and combines the experts' output rows back,
// weighted by the routing probabilities and summed per token (unpermute). Every step is a
// conjugate pair whose backward is beside it. An expert-parallel dispatcher (all-to-all over the
// expert group) replaces this class without changing the router or the experts: it takes the
// same Routing and gives the experts the same [M, h] rows with per-expert counts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/moe/routing.h"

namespace megatron::model {

// Where each permuted row comes from: M = sum of tokens_per_expert rows.
struct DispatchPlan {
  int64_t num_tokens = 0;             // N
  int num_experts = 0;                // E
  std::vector<int64_t> counts;        // [E] rows per expert
  std::vector<int32_t> token;         // [M] the token of each permuted row (host)
  Tensor index;                       // [M] int32: token, on the device (undefined when M = 0)
  Tensor probs;                       // [M, 1, 1] fp32 routing probability of each row
  int64_t rows() const { return int64_t(token.size()); }
};

class LocalTokenDispatcher {
 public:
  DispatchPlan plan(const Routing& routing, Device device) const;
  // x [N, h] -> [M, h] rows in expert-major order.
  Tensor dispatch(const DispatchPlan& p, const Tensor& x) const;
  // dx [N, h] += the rows of dxp [M, h] summed per token (dispatch's backward).
  void dispatch_backward(const DispatchPlan& p, const Tensor& dxp, const Tensor& dx) const;
  // y [M, h] -> [N, h]: out[t] = sum over t's rows m of probs[m] * y[m].
  Tensor combine(const DispatchPlan& p, const Tensor& y) const;
  // From dout [N, h]: dy [M, h] = probs[m] * dout[token m], and d(probs) as [N, E] (row-major,
  // dprobs[t*E + e] = <dout[t], y[m]> for t's row m at expert e; 0 elsewhere).
  Tensor combine_backward(const DispatchPlan& p, const Tensor& dout, const Tensor& y,
                          std::vector<double>& dprobs) const;
};

// --moe-token-dispatcher-type: allgather | alltoall; flex (DeepEP) is refused by name.
enum class DispatcherKind : uint8_t { allgather, alltoall };
DispatcherKind parse_dispatcher_kind(const std::string& name);

// The token dispatcher of an MoE layer over its expert-parallel group `ep` (null or of size 1: no
// expert parallelism) and the experts' tensor-parallel group `etp` when the experts leave their
// communication to the dispatcher (wherever every rank routes tokens of its own: under sequence
// parallelism, or at tensor-parallel size 1 with an expert tensor-parallel size; null otherwise,
// and when of size 1). Each rank routes
// its own N tokens over all E experts (its sequence shard under sequence parallelism) and owns
// the L = E / P consecutive experts [ep_rank * L, (ep_rank + 1) * L). With neither group it is
// the local dispatcher, whichever kind.
//   alltoall (Megatron's MoEAlltoAllTokenDispatcher): the rows are permuted by expert locally,
//     the per-expert counts gathered over the tensor x expert group, the rows sent to their
//     experts' ranks (all-to-all-v over EP), then gathered over the experts' tensor-parallel
//     group (all-gather of uneven pieces), and the received rows sorted from (TP rank, EP rank,
//     local expert) into (local expert, TP rank, EP rank) order; the experts' outputs go back the
//     inverse way (the partial sums of the TP ranks reduce-scattered) and are combined where
//     their tokens live.
//   allgather (Megatron's MoEAllGatherTokenDispatcher): every rank gathers the tokens and routing
//     of its tensor x expert group (over TP, then over EP: the group's rank order, TP fastest),
//     computes its experts over the rows routed to them and weights them by their probabilities;
//     the partial outputs are reduce-scattered back to the tokens' ranks (over EP, then TP).
// With `etp`, every TP rank of an expert computes on the same gathered rows with its shard of the
// expert's weights and communicates nothing itself (TensorParallel::explicit_expert_comm): its
// outputs and input gradients are partial sums over the group, summed by the dispatcher's
// reduce-scatters.
// Each step's backward is its conjugate beside it (all-to-all-v <-> the inverse all-to-all-v,
// all-gather <-> reduce-scatter). A rank that is sent no rows (or has no tokens routed anywhere)
// takes part in every collective with empty pieces.
// The layer calls, in forward: plan, dispatch, (experts), return_rows, combine; in backward:
// plan, combine_backward, return_rows_backward, (experts), dispatch_backward.
class TokenDispatcher {
 public:
  TokenDispatcher(DispatcherKind kind, std::shared_ptr<Communicator> ep, int num_experts,
                  std::shared_ptr<Communicator> etp = nullptr);

  struct Plan {
    // alltoall and local: this rank's tokens over all experts; allgather: the group's gathered
    // tokens (in the group's rank order) over this rank's experts.
    DispatchPlan local;
    int64_t num_tokens = 0;               // N, this rank's tokens
    std::vector<int64_t> expert_counts;   // [L] rows each local expert computes
    std::vector<int64_t> send_rows, recv_rows;  // alltoall: [P] rows to / from each EP rank
    std::vector<int64_t> tp_rows;         // alltoall with etp: [T] rows gathered from each TP rank
    Tensor sort_index, unsort_index;      // alltoall: [R] int32 (undefined when R = 0)
    int64_t expert_rows() const;          // R, the rows this rank's experts compute
  };

  int local_experts() const { return num_experts_ / ep_size(); }
  int first_expert() const { return ep_rank() * local_experts(); }

  // Collective over the tensor x expert group (it exchanges counts or routing).
  Plan plan(const Routing& routing, Device device) const;
  // x [N, h] -> [R, h], the rows of this rank's experts, expert-major.
  Tensor dispatch(const Plan& p, const Tensor& x) const;
  // dx [N, h] += the gradient of x, from the experts' input gradient dxp [R, h].
  void dispatch_backward(const Plan& p, const Tensor& dxp, const Tensor& dx) const;
  // The experts' outputs y [R, h] -> the rows the combine weights (alltoall: [M, h] back at the
  // tokens' rank, in the order of p.local; otherwise y itself).
  Tensor return_rows(const Plan& p, const Tensor& y) const;
  Tensor return_rows_backward(const Plan& p, const Tensor& dyr) const;
  // yr -> out [N, h] fp32: sum over each token's rows of probability * row.
  Tensor combine(const Plan& p, const Tensor& yr) const;
  // dout [N, h] -> d(yr), and dprobs [N * E] (this rank's tokens, all experts; row-major).
  Tensor combine_backward(const Plan& p, const Tensor& dout, const Tensor& yr,
                          std::vector<double>& dprobs) const;

 private:
  int ep_size() const { return ep_ ? ep_->size() : 1; }
  int ep_rank() const { return ep_ ? ep_->rank() : 0; }
  int tp_size() const { return etp_ ? etp_->size() : 1; }
  int tp_rank() const { return etp_ ? etp_->rank() : 0; }
  bool local() const { return ep_size() == 1 && tp_size() == 1; }
  // allgather: x [n, h] of every rank of the tensor x expert group -> [T * P * n, h] in the
  // group's rank order (all-gathers over TP, then EP); and the conjugate reduce-scatter.
  Tensor gather_group(const Tensor& x) const;
  Tensor reduce_scatter_group(const Tensor& all, int64_t n) const;
  // alltoall: rows [M, h] in p.local's order -> [R, h] expert-major at the experts' ranks, and back.
  Tensor to_experts(const Plan& p, const Tensor& rows) const;
  Tensor from_experts(const Plan& p, const Tensor& rows) const;

  DispatcherKind kind_;
  std::shared_ptr<Communicator> ep_, etp_;
  int num_experts_;
  LocalTokenDispatcher local_;
};

}  // namespace megatron::model
