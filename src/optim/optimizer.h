// The optimizer over a model's ParameterList: AdamW (decoupled weight decay, bias correction) or
// SGD with momentum, both on fp32 main parameters. For bf16/fp16 models the optimizer holds an
// fp32 main copy of every parameter and copies the updated value back in the parameter dtype
// (Megatron's Float16OptimizerWithFloat16Params); for fp32 models the parameter itself is the
// main copy (FP32Optimizer). One step = unscale grads by 1/loss_scale, check for inf/NaN (skip the
// step and update the scaler when found), global L2 grad norm, clip (coeff = clip/(norm+1e-6)
// when < 1), update. Weight decay applies only to parameters with Parameter::weight_decay.
// Under tensor/data parallelism set_grad_stats_group() makes the inf check and the grad norm
// global: Megatron's rule (model/tensor_parallel.h) counts TP-replicated parameters on TP rank 0
// only, the local sums are SUM-all-reduced over the model-parallel group, and every rank skips
// (or not) together. The sharded variant is optim/distributed_optimizer.h.
// --decoupled-lr (Megatron's _get_param_groups): the parameters marked is_embedding_or_output
// (the word embedding and the output layer, incl. the last pipeline stage's tied copy; not the
// position embedding) form their own group updated with the decoupled LR.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/parameter.h"
#include "optim/grad_scaler.h"
#include "optim/megatron_optimizer.h"

namespace megatron::optim {

// Optimizer state of one parameter. exp_avg is SGD's momentum buffer; exp_avg_sq is undefined
// for SGD.
struct ParamState {
  Tensor main;  // fp32 main parameter (the parameter's own value when it is fp32)
  Tensor exp_avg, exp_avg_sq;
};

class Optimizer final : public MegatronOptimizer {
 public:
  Optimizer(model::ParameterList params, const OptimizerConfig& cfg);

  // MegatronOptimizer (megatron_optimizer.h).
  void zero_grad() override;  // zeroes every Parameter::grad
  StepResult step(double lr, double weight_decay, GradScaler& scaler,
                  double decoupled_lr = std::nan("")) override;
  void set_decoupled_lr_params(std::vector<bool> flags) override;
  const OptimizerConfig& config() const override { return cfg_; }
  const model::ParameterList& parameters() const override { return params_; }
  int64_t step_count() const override { return step_count_; }
  void set_step_count(int64_t n) override { step_count_ = n; }
  void reload_main_from_model() override;
  void copy_main_to_model() override;
  std::vector<StatePiece> state_pieces() override;  // one whole parameter per piece

  std::vector<ParamState>& state() { return state_; }
  // Model parallelism: reduce the inf check and the grad norm over `group` (the model-parallel
  // group; this rank is TP rank `tp_rank`). nullptr: this rank's gradients are the whole model.
  void set_grad_stats_group(Communicator* group, int tp_rank) {
    stats_group_ = group;
    tp_rank_ = tp_rank;
    counted_.clear();
  }
  // The same over `group` with the parameters this rank counts given one by one (model order):
  // expert parallelism, where the rule differs between expert and other weights.
  void set_grad_stats_group(Communicator* group, std::vector<bool> counted) {
    MG_CHECK(counted.size() == params_.size(), "one grad-norm flag per parameter");
    stats_group_ = group;
    counted_ = std::move(counted);
  }

 private:
  model::ParameterList params_;
  OptimizerConfig cfg_;
  Communicator* stats_group_ = nullptr;
  int tp_rank_ = 0;
  std::vector<bool> counted_;  // empty: the tensor-parallel rule
  std::vector<ParamState> state_;
  std::vector<bool> decoupled_;  // empty: no decoupled group
  int64_t step_count_ = 0;
};

// The update rules both optimizers share (fp32 contiguous tensors of one size).
// SGD (torch.optim.SGD, coupled weight decay): g += wd * p; buf = first ? g : momentum * buf + g;
// p -= lr * buf.
void sgd_update(const Tensor& main, const Tensor& grad, const Tensor& buf, double lr, double wd,
                double momentum, bool first);
// One parameter's (or shard's) step under cfg: AdamW (exp_avg_sq used) or SGD (exp_avg is the
// momentum buffer), `step` the 1-based count of successful steps. When model_copy is defined it
// receives the updated main value in its own dtype.
void update_parameter(const OptimizerConfig& cfg, const Tensor& main, const Tensor& grad,
                      const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& model_copy,
                      double lr, double wd, int64_t step);
void scale_inplace(const Tensor& t, float factor);  // t *= factor
// Reduces {found non-finite (0/1), sum of squares} over `group` in one SUM all-reduce and
// returns {any rank found a non-finite value, global sum of squares}.
std::pair<bool, double> reduce_grad_stats(Communicator* group, bool local_nonfinite,
                                          double local_sum_sq);

}  // namespace megatron::optim
