// The optimizer over a model's ParameterList: AdamW (decoupled weight decay, bias correction) or
// SGD with momentum, both on fp32 main parameters. For bf16/fp16 models the optimizer holds an
// fp32 main copy of every parameter and copies the updated value back in the parameter dtype
// (Megatron's Float16OptimizerWithFloat16Params); for fp32 models the parameter itself is the
// main copy (FP32Optimizer). One step = unscale grads by 1/loss_scale, check for inf/NaN (skip the
// step and update the scaler when found), global L2 grad norm, clip (coeff = clip/(norm+1e-6)
// when < 1), update. Weight decay applies only to parameters with Parameter::weight_decay.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/parameter.h"
#include "optim/grad_scaler.h"

namespace megatron::optim {

enum class OptimizerType { Adam, SGD };
OptimizerType parse_optimizer_type(const std::string& s);  // "adam" | "sgd"; Error otherwise

struct OptimizerConfig {
  OptimizerType type = OptimizerType::Adam;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;  // 0 disables clipping
};

struct StepResult {
  bool skipped = false;    // inf/NaN found in the (unscaled) gradients: no update was made
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients (before clipping); NaN/inf
                           // when skipped
};

// Optimizer state of one parameter. exp_avg is SGD's momentum buffer; exp_avg_sq is undefined
// for SGD.
struct ParamState {
  Tensor main;  // fp32 main parameter (the parameter's own value when it is fp32)
  Tensor exp_avg, exp_avg_sq;
};

class Optimizer {
 public:
  Optimizer(model::ParameterList params, const OptimizerConfig& cfg);

  void zero_grad();  // zeroes every Parameter::grad
  // Unscale, check, clip and update with this step's LR and weight decay. Updates the scaler.
  StepResult step(double lr, double weight_decay, GradScaler& scaler);

  const model::ParameterList& parameters() const { return params_; }
  std::vector<ParamState>& state() { return state_; }
  int64_t step_count() const { return step_count_; }  // successful steps (Adam bias correction)
  void set_step_count(int64_t n) { step_count_ = n; }
  // Main params <- model params (after loading model weights without optimizer state).
  void reload_main_from_model();
  // Model params <- main params (after loading main params from a checkpoint).
  void copy_main_to_model();
  const OptimizerConfig& config() const { return cfg_; }

 private:
  model::ParameterList params_;
  OptimizerConfig cfg_;
  std::vector<ParamState> state_;
  int64_t step_count_ = 0;
};

// Global L2 norm (double accumulation) of the given fp32 tensors.
double global_l2_norm(const std::vector<Tensor>& tensors);

}  // namespace megatron::optim
