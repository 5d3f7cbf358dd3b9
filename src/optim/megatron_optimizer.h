// The optimizer interface the trainer and checkpoints use (Megatron's MegatronOptimizer): one
// step over the model's gradients (unscale, inf/NaN check, grad norm, clip, update), the fp32
// main parameters kept in step with the model's, the successful-step count for Adam's bias
// correction, and the state a checkpoint saves, in parameter space. Two implementations: the
// plain optimizer (optimizer.h: every rank holds all the state; Megatron's FP32Optimizer and
// Float16OptimizerWithFloat16Params) and the distributed optimizer (distributed_optimizer.h: the
// state sharded over the data-parallel ranks; Megatron's DistributedOptimizer).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
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

// The optimizer state of one contiguous run of a parameter's elements that this rank holds:
// elements [param_offset, param_offset + length) of the flattened parameter parameters()[param].
// The tensors are views of the optimizer's own storage (writing them sets the state).
struct StatePiece {
  size_t param = 0;
  int64_t param_offset = 0, length = 0;
  int64_t shard_offset = 0;  // where the piece lies in shard()'s buffers (sharded state only)
  Tensor main;               // fp32 main values; undefined where the fp32 parameter is its own
                             // main copy (a checkpoint then saves the parameter only)
  Tensor exp_avg;            // Adam's first moment, or SGD's momentum buffer
  Tensor exp_avg_sq;         // Adam's second moment; undefined for SGD
};

// The distributed optimizer's flat shard buffers, [shard size] fp32 each (padding included);
// main is undefined where the model is fp32 (its parameters are the main weights).
struct ShardBuffers {
  Tensor main, exp_avg, exp_avg_sq;
};

class MegatronOptimizer {
 public:
  virtual ~MegatronOptimizer() = default;
  // Zeroes every gradient the step reads.
  virtual void zero_grad() = 0;
  // Unscale, check, clip and update with this step's LR and weight decay; updates the scaler.
  // Parameters marked by set_decoupled_lr_params() take decoupled_lr instead of lr.
  virtual StepResult step(double lr, double weight_decay, GradScaler& scaler,
                          double decoupled_lr = std::nan("")) = 0;
  // --decoupled-lr: flags[i] puts parameter i (model order) in Megatron's decoupled LR group
  // (the word embedding and the output layer).
  virtual void set_decoupled_lr_params(std::vector<bool> flags) = 0;
  // Completes anything the step left in flight (the distributed optimizer's parameter
  // all-gather under --overlap-param-gather): after it every parameter holds its updated value.
  virtual void finish_param_sync() {}
  virtual const OptimizerConfig& config() const = 0;
  virtual const model::ParameterList& parameters() const = 0;
  virtual int64_t step_count() const = 0;  // successful steps (Adam's bias correction)
  virtual void set_step_count(int64_t n) = 0;
  // Main params <- model params (after loading model weights without optimizer state).
  virtual void reload_main_from_model() = 0;
  // Model params <- main params (after loading main params from a checkpoint).
  virtual void copy_main_to_model() = 0;
  // The state this rank holds, piece by piece in parameter order: the plain optimizer one whole
  // parameter per piece, the distributed one the pieces of its shard.
  virtual std::vector<StatePiece> state_pieces() = 0;
  // The flat buffers the pieces view when the state is sharded over the data-parallel ranks (each
  // rank saves its own shard); nullopt when every data-parallel rank holds all of it (data
  // parallel rank 0 saves it).
  virtual std::optional<ShardBuffers> shard() const { return std::nullopt; }
};

}  // namespace megatron::optim
