// The local token dispatcher (Megatron-Core's MoEAllGatherTokenDispatcher at one rank): permutes
// a micro-batch's token rows into expert-major order (expert 0's tokens, then expert 1's, ...,
// each in token order, as moe_utils.permute does) and combines the experts' output rows back,
// weighted by the routing probabilities and summed per token (unpermute). Every step is a
// conjugate pair whose backward is beside it. An expert-parallel dispatcher (all-to-all over the
// expert group) replaces this class without changing the router or the experts: it takes the
// same Routing and gives the experts the same [M, h] rows with per-expert counts.
#pragma once

#include <cstdint>
#include <vector>

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

}  // namespace megatron::model
