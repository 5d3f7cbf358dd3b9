// The experts of an MoE layer as one grouped product (--moe-grouped-gemm, Megatron-Core's
// TEGroupedMLP): every local expert's fc1 over its block of the permuted rows in one grouped
// matrix product, one activation over all rows, then every expert's fc2 in one grouped product.
// The weights are Megatron-Core's grouped names, one tensor per expert:
// <prefix>.linear_fc1.weight<e> [F1, h] and <prefix>.linear_fc2.weight<e> [h, F] (each recording
// its expert); the numbers equal the sequential experts' (experts.h) on the same weights.
// Parallel as the sequential experts are: under expert parallelism a rank holds its experts,
// [rank * E/P, (rank + 1) * E/P), named by their global number; each expert's fc1 is cut along
// its output rows and fc2 along its input columns over the experts' tensor-parallel group (the
// gated fc1 as [gate; up] per shard, as the dense MLP). Under explicit_expert_comm the token
// dispatcher gathers the rows and reduce-scatters the partial outputs; otherwise (tensor
// parallelism without sequence parallelism: whole sequences on every rank) the layer all-reduces
// fc2's output and fc1's input gradient itself, as the column/row-parallel pair does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/layer_spec.h"
#include "model/module.h"
#include "model/tensor_parallel.h"
#include "model/transformer_config.h"

namespace megatron::model {

// c's row block g = a's row block g times b[g] (transposed with trans_b), for the blocks of
// rows[g] rows in order (empty blocks skipped): the grouped GEMM over variable token counts.
void grouped_gemm(const Tensor& a, const std::vector<int64_t>& rows, const std::vector<const Tensor*>& b,
                  bool trans_b, const Tensor& c);
// dw[g] += (a's block g)^T times (d's block g): the weight gradients of grouped_gemm with
// trans_b (dw[g] has b[g]'s shape, [n, k] for d [M, n] and a [M, k]).
void grouped_gemm_wgrad(const Tensor& d, const Tensor& a, const std::vector<int64_t>& rows,
                        const std::vector<Tensor*>& dw);

class GroupedExperts : public Module {
 public:
  // tp: the experts' tensor parallelism (MoELayer's experts_tensor_parallel), with the
  // expert-parallel group.
  GroupedExperts(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
                 const TensorParallel& tp, bool grad);
  // xp [M, h]: counts[e] rows per local expert, expert-major -> [M, h].
  Tensor forward(const LayerContext& ctx, const Tensor& xp, const std::vector<int64_t>& counts);
  Tensor backward(const LayerContext& ctx, const Tensor& dyp, const std::vector<int64_t>& counts);
  int num_experts() const { return int(fc1_.size()); }  // the local experts
  int first_expert() const { return first_; }           // the global number of local expert 0

 private:
  const ActivationKind& activation_;
  TensorParallel tp_;
  int first_ = 0;
  std::vector<std::unique_ptr<Weight>> fc1_, fc2_;
  SavedTensor x_{this, "x", "[M, h] the permuted rows"};
  SavedTensor h1_{this, "h1", "[M, F1] fc1 outputs, pre-activation"};
  SavedTensor a1_{this, "a1", "[M, F] activation outputs"};
};

}  // namespace megatron::model
