// The experts of an MoE layer (Megatron-Core's SequentialMLP): E MLPs of the model's activation
// (GeLU forms, SwiGLU, squared ReLU) and width --moe-ffn-hidden-size, named
// <prefix>.local_experts.<i>.linear_fc1/linear_fc2 and tensor-parallel as the dense MLP is (the
// expert tensor-parallel group is the tensor-parallel group). Each runs over its block of the
// permuted rows; an expert given no rows is skipped. Each expert weight records its expert
// (WeightSpec::expert). Under expert parallelism (tp.expert_parallel of size P) a rank holds only
// its experts, Megatron's local_expert_indices: [rank * E/P, (rank + 1) * E/P), named by their
// global number as in the single-rank model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/mlp.h"

namespace megatron::model {

class SequentialExperts : public Module {
 public:
  SequentialExperts(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
                    const TensorParallel& tp, bool grad);
  // xp [M, h]: counts[e] rows per expert, expert-major -> [M, h].
  Tensor forward(const LayerContext& ctx, const Tensor& xp, const std::vector<int64_t>& counts);
  Tensor backward(const LayerContext& ctx, const Tensor& dyp, const std::vector<int64_t>& counts);
  int num_experts() const { return int(experts_.size()); }  // the local experts
  int first_expert() const { return first_; }  // the global number of local expert 0
  MLP& expert(int e) { return *experts_.at(size_t(e)); }  // local index

 private:
  int first_ = 0;
  std::vector<std::unique_ptr<MLP>> experts_;
};

}  // namespace megatron::model
