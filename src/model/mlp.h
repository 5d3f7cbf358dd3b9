// The MLP (Megatron-Core's MLP): y = linear_fc2(act(linear_fc1(x))), returned without fc2's bias
// (the layer's bias-dropout-add adds it). The activation comes from the layer spec; a gated one
// (SwiGLU) makes linear_fc1 produce [gate | up] for F outputs, which each tensor-parallel rank
// holds as its own gate rows followed by its own up rows (Parameter::partition_parts = 2), as
// Megatron does. linear_fc1 is column-parallel, linear_fc2 row-parallel.
#pragma once

#include <string>

#include "model/layer_spec.h"
#include "model/module.h"
#include "model/parallel_layers.h"
#include "model/transformer_config.h"

namespace megatron::model {

class MLP : public Module {
 public:
  // ffn_hidden: the hidden width F (0: cfg.ffn(); an expert's or a shared expert's width).
  MLP(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
      const TensorParallel& tp = TensorParallel::none(), bool grad = true, int ffn_hidden = 0);
  // x and the result are [N, h], or [N/T, h] under sequence parallelism.
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // -> without fc2 bias
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx
  const ActivationKind& activation;
  ColumnParallelLinear linear_fc1;
  RowParallelLinear linear_fc2;

 private:
  SavedTensor h1_{this, "h1", "[N, F/T] fc1 output, pre-activation ([N, 2F/T] when gated)"};
  SavedTensor a1_{this, "a1", "[N, F/T] activation output, input of fc2"};
};

}  // namespace megatron::model
