// The optimizer interface the trainer and checkpoints use (Megatron's MegatronOptimizer): one
// step over the model's gradients (unscale, inf/NaN check, grad norm, clip, update), the fp32
// main parameters kept in step with the model's, the successful-step count for Adam's bias
// correction. Two implementations: the plain optimizer (optimizer.h: every rank holds all the
// state) and the distributed optimizer (distributed_optimizer.h: state sharded over the data
// parallel ranks).
#pragma once

#include <cstdint>

#include "optim/grad_scaler.h"

namespace megatron::optim {

struct OptimizerConfig;
struct StepResult;

class MegatronOptimizer {
 public:
  virtual ~MegatronOptimizer() = default;
  // Zeroes every gradient the step reads.
  virtual void zero_grad() = 0;
  // Unscale, check, clip and update with this step's LR and weight decay; updates the scaler.
  virtual StepResult step(double lr, double weight_decay, GradScaler& scaler) = 0;
  // Completes anything the step left in flight (the distributed optimizer's parameter
  // all-gather under --overlap-param-gather): after it every parameter holds its updated value.
  virtual void finish_param_sync() {}
  virtual const OptimizerConfig& config() const = 0;
  virtual int64_t step_count() const = 0;  // successful steps (Adam's bias correction)
  virtual void set_step_count(int64_t n) = 0;
  // Main params <- model params (after loading model weights without optimizer state).
  virtual void reload_main_from_model() = 0;
  // Model params <- main params (after loading main params from a checkpoint).
  virtual void copy_main_to_model() = 0;
};

}  // namespace megatron::optim
