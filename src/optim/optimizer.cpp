// AdamW / SGD over fp32 main parameters with loss-scale unscaling, inf/NaN skip and clipping.
#include "optim/optimizer.h"

#include <cmath>

#include "core/error.h"
#include "kernels/fused_optim.h"
#include "kernels/ops.h"
#include "model/tensor_parallel.h"
#include "optim/update_rules.h"

namespace megatron::optim {

OptimizerType parse_optimizer_type(const std::string& s) {
  if (s == "adam") return OptimizerType::Adam;
  if (s == "sgd") return OptimizerType::SGD;
  MG_THROW("--optimizer: unknown value '", s, "'; use adam or sgd");
}

void scale_inplace(const Tensor& t, float factor) {
  MG_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "grads must be contiguous fp32");
  ops::scale(t, factor);
}

void update_parameter(const OptimizerConfig& cfg, const Tensor& main, const Tensor& grad,
                      const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& model_copy,
                      double lr, double wd, int64_t step) {
  update_parameter_scaled(cfg, main, grad, exp_avg, exp_avg_sq, model_copy, lr, wd, step, 1.0f);
}

void update_parameter_scaled(const OptimizerConfig& cfg, const Tensor& main, const Tensor& grad,
                             const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const Tensor& model_copy, double lr, double wd, int64_t step,
                             float grad_scale) {
  if (cfg.type == OptimizerType::Adam) {
    ops::AdamWConfig ac;
    ac.lr = float(lr);
    ac.beta1 = float(cfg.adam_beta1);
    ac.beta2 = float(cfg.adam_beta2);
    ac.eps = float(cfg.adam_eps);
    ac.weight_decay = float(wd);
    ac.step = step;
    ops::adamw_step_scaled(main, grad, exp_avg, exp_avg_sq, model_copy, ac, grad_scale);
  } else {
    if (grad_scale != 1.0f) scale_inplace(grad, grad_scale);
    sgd_update(main, grad, exp_avg, lr, wd, cfg.sgd_momentum, step == 1);
    if (model_copy.defined()) {
      Tensor dst = model_copy;
      dst.copy_(main);
    }
  }
}

void sgd_update(const Tensor& main, const Tensor& grad, const Tensor& buf, double lr, double wd,
                double momentum, bool first) {
  ops::sgd_step(main, grad, buf, float(lr), float(wd), float(momentum), first || momentum == 0.0);
}

std::pair<bool, double> reduce_grad_stats(Communicator* group, bool local_nonfinite,
                                          double local_sum_sq) {
  if (group == nullptr || group->size() == 1) return {local_nonfinite, local_sum_sq};
  Tensor t = Tensor::from_vector<double>({local_nonfinite ? 1.0 : 0.0, local_sum_sq}, {2});
  group->all_reduce(t, ReduceOp::Sum);
  return {ops::sum(t.narrow(0, 0, 1)) > 0.0, ops::sum(t.narrow(0, 1, 1))};
}

Optimizer::Optimizer(model::ParameterList params, const OptimizerConfig& cfg)
    : params_(std::move(params)), cfg_(cfg) {
  MG_REQUIRE(cfg.clip_grad >= 0.0, "--clip-grad must be >= 0 (got ", cfg.clip_grad, ")");
  MG_REQUIRE(cfg.adam_beta1 >= 0.0 && cfg.adam_beta1 < 1.0, "--adam-beta1 must be in [0, 1)");
  MG_REQUIRE(cfg.adam_beta2 >= 0.0 && cfg.adam_beta2 < 1.0, "--adam-beta2 must be in [0, 1)");
  MG_REQUIRE(cfg.adam_eps > 0.0, "--adam-eps must be > 0");
  MG_REQUIRE(cfg.sgd_momentum >= 0.0, "--sgd-momentum must be >= 0");
  state_.reserve(params_.size());
  for (model::Parameter* p : params_) {
    MG_CHECK(p != nullptr && p->value.defined() && p->grad.defined(), "parameter without storage");
    MG_CHECK(p->grad.dtype() == DType::F32 && p->grad.numel() == p->value.numel(),
             "parameter ", p->name, ": grad must be fp32 of the value's size");
    ParamState s;
    s.main = p->value.dtype() == DType::F32 ? p->value : p->value.to(DType::F32);
    const Device dev = p->value.device();
    s.exp_avg = Tensor::zeros(p->value.shape(), DType::F32, dev);
    if (cfg.type == OptimizerType::Adam)
      s.exp_avg_sq = Tensor::zeros(p->value.shape(), DType::F32, dev);
    state_.push_back(std::move(s));
  }
}

void Optimizer::zero_grad() {
  for (model::Parameter* p : params_) p->grad.zero_();
}

void Optimizer::reload_main_from_model() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (state_[i].main.storage() != params_[i]->value.storage()) state_[i].main.copy_(params_[i]->value);
}

void Optimizer::copy_main_to_model() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (state_[i].main.storage() != params_[i]->value.storage()) params_[i]->value.copy_(state_[i].main);
}

std::vector<StatePiece> Optimizer::state_pieces() {
  std::vector<StatePiece> pieces;
  for (size_t i = 0; i < params_.size(); ++i) {
    StatePiece p;
    p.param = i;
    p.length = params_[i]->value.numel();
    if (state_[i].main.storage() != params_[i]->value.storage()) p.main = state_[i].main;
    p.exp_avg = state_[i].exp_avg;
    p.exp_avg_sq = state_[i].exp_avg_sq;
    pieces.push_back(std::move(p));
  }
  return pieces;
}

void Optimizer::set_decoupled_lr_params(std::vector<bool> flags) {
  MG_CHECK(flags.empty() || flags.size() == params_.size(), "one decoupled-LR flag per parameter");
  decoupled_ = std::move(flags);
}

StepResult Optimizer::step(double lr, double weight_decay, GradScaler& scaler, double decoupled_lr) {
  StepResult r;
  std::vector<Tensor> grads;
  grads.reserve(params_.size());
  for (model::Parameter* p : params_) grads.push_back(p->grad);
  const double inv = scaler.inv_scale();
  if (inv != 1.0)
    for (const Tensor& g : grads) scale_inplace(g, float(inv));
  // One pass over the gradients for the finite check and the norm: a gradient's sum of squares
  // (in double) is finite exactly when all its elements are (ops::l2_norm_squared). Summed in
  // parameter order over those this rank counts (all of them without a model-parallel group).
  bool finite = true;
  double sum_sq = 0.0;
  const std::vector<double> squares = ops::l2_norm_squared_each(grads);  // one read-back
  for (size_t i = 0; i < grads.size(); ++i) {
    const double sq = squares[i];
    finite = finite && std::isfinite(sq);
    if (stats_group_ == nullptr ||
        (counted_.empty() ? model::param_counts_in_grad_norm(*params_[i], tp_rank_) : counted_[i]))
      sum_sq += sq;
  }
  r.grad_norm = std::sqrt(sum_sq);
  if (stats_group_ != nullptr) {  // every rank of the model-parallel group decides the same
    const auto [nonfinite, total] = reduce_grad_stats(stats_group_, !finite, finite ? sum_sq : 0.0);
    finite = !nonfinite;
    r.grad_norm = std::sqrt(total);
  }
  scaler.update(!finite);
  if (!finite) {
    r.skipped = true;
    r.grad_norm = std::nan("");
    return r;
  }
  // Clipping scales each gradient as the update reads it (update_parameter_scaled).
  float clip = 1.0f;
  if (cfg_.clip_grad > 0.0) {
    const double coeff = cfg_.clip_grad / (r.grad_norm + 1e-6);
    if (coeff < 1.0) clip = float(coeff);
  }
  ++step_count_;
  for (size_t i = 0; i < params_.size(); ++i) {
    model::Parameter& p = *params_[i];
    ParamState& s = state_[i];
    const double wd = p.weight_decay ? weight_decay : 0.0;
    const bool separate = s.main.storage() != p.value.storage();
    const bool dec = !decoupled_.empty() && decoupled_[i];
    MG_CHECK(!dec || !std::isnan(decoupled_lr), "decoupled-LR parameter without a decoupled LR");
    update_parameter_scaled(cfg_, s.main, p.grad, s.exp_avg, s.exp_avg_sq,
                            separate ? p.value : Tensor(), dec ? decoupled_lr : lr, wd, step_count_,
                            clip);
  }
  return r;
}

}  // namespace megatron::optim
