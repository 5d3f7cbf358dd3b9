// A normalization layer over the last dimension, of the kind the layer spec chooses (LayerNorm,
// RMSNorm; layer_spec.h). With zero_centered_gamma (--apply-layernorm-1p) the stored weight is
// gamma - 1, initialised to 0, and the layer computes with weight + 1 (Megatron's
// zero-centred gamma). Under sequence parallelism (or as a per-head query/key norm under tensor
// parallelism) the weights' gradients are partial sums over the tensor-parallel group
// (`partial_grad`: Parameter::sequence_parallel).
#pragma once

#include <string>

#include "model/layer_spec.h"
#include "model/module.h"

namespace megatron::model {

struct NormOptions {
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  bool partial_grad = false;
  bool grad = true;  // allocate gradients (training)
};

class Norm : public Module {
 public:
  Norm(const std::string& prefix, int64_t h, const NormKind& kind, DType dtype,
       const NormOptions& opt);
  // x [N, h] -> [N, h] in out_dtype: fp32, or bf16 where the output only feeds bf16 products
  // (the same values the product's operand cast would give, without the fp32 pass).
  Tensor forward(const LayerContext& ctx, const Tensor& x, DType out_dtype = DType::F32);
  Tensor backward(const LayerContext& ctx, const Tensor& dout);  // -> dx [N, h]
  // dx_accum += d(input) (the residual stream's gradient).
  void backward_accumulate(const LayerContext& ctx, const Tensor& dout, const Tensor& dx_accum);
  const NormKind& kind;
  Weight weight, bias;  // bias undefined for kinds without one (RMSNorm)
  float eps;

 private:
  void run_backward(const Tensor& dx, const Tensor& dout, bool accumulate);
  SavedTensor x_{this, "x", "[N, h] input (the caller's)"};
  SavedTensor mean_{this, "mean", "[N] (kinds that save the mean: LayerNorm)"};
  SavedTensor rstd_{this, "rstd", "[N]"};
};

}  // namespace megatron::model
