// update_parameter (optimizer.h) with the gradient-clipping scale folded into the update.
#pragma once

#include "optim/optimizer.h"

namespace megatron::optim {

// update_parameter on grad * grad_scale, leaving grad as it is: AdamW reads the scaled gradient in
// its own pass (ops::adamw_step_scaled, bit-identical to scaling first); SGD scales grad first.
void update_parameter_scaled(const OptimizerConfig& cfg, const Tensor& main, const Tensor& grad,
                             const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const Tensor& model_copy, double lr, double wd, int64_t step,
                             float grad_scale);

}  // namespace megatron::optim
