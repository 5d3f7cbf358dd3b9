// Optimizer updates fused with a pass the step would otherwise make on its own.
#pragma once

#include "kernels/ops.h"

namespace megatron::ops {

// ops::adamw_step on the gradient times grad_scale (gradient clipping), leaving grad as it is.
// Bit-identical to ops::scale(grad, grad_scale) followed by ops::adamw_step: the product is
// rounded to fp32 as the scale pass rounds it. On the CPU one pass over the elements (the scale
// pass's read and write of the gradient saved); on other devices those two ops in turn.
void adamw_step_scaled(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& cfg,
                       float grad_scale);

namespace cpu {
// The CPU kernel of adamw_step_scaled (src/kernels/cpu/cpu_loss_optim.cpp); host tensors.
void adamw_step_scaled(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& cfg,
                       float grad_scale);
}  // namespace cpu

}  // namespace megatron::ops
