#include "kernels/fused_optim.h"

#include "kernels/op_profile.h"

namespace megatron::ops {

void adamw_step_scaled(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& cfg,
                       float grad_scale) {
  const auto on_cpu = [](const Tensor& t) { return !t.defined() || t.device().is_cpu(); };
  if (on_cpu(master) && on_cpu(grad) && on_cpu(exp_avg) && on_cpu(exp_avg_sq) &&
      on_cpu(model_copy)) {
    profile::Scope scope("adamw_step");
    cpu::adamw_step_scaled(master, grad, exp_avg, exp_avg_sq, model_copy, cfg, grad_scale);
    return;
  }
  if (grad_scale != 1.0f) scale(grad, grad_scale);
  adamw_step(master, grad, exp_avg, exp_avg_sq, model_copy, cfg);
}

}  // namespace megatron::ops
