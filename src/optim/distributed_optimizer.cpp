// Sharded AdamW/SGD over the flat data-parallel buffer (see distributed_optimizer.h).
#include "optim/distributed_optimizer.h"

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/tensor_parallel.h"

namespace megatron::optim {

DistributedOptimizer::DistributedOptimizer(ParamAndGradBuffer& buffer, const OptimizerConfig& cfg,
                                           Communicator& grad_stats, int tp_rank)
    : buffer_(buffer), cfg_(cfg), grad_stats_(grad_stats), tp_rank_(tp_rank) {
  MG_CHECK(buffer.sharded(), "the distributed optimizer needs a buffer padded for sharding");
  MG_REQUIRE(cfg.clip_grad >= 0.0, "--clip-grad must be >= 0 (got ", cfg.clip_grad, ")");
  MG_REQUIRE(cfg.adam_beta1 >= 0.0 && cfg.adam_beta1 < 1.0, "--adam-beta1 must be in [0, 1)");
  MG_REQUIRE(cfg.adam_beta2 >= 0.0 && cfg.adam_beta2 < 1.0, "--adam-beta2 must be in [0, 1)");
  MG_REQUIRE(cfg.adam_eps > 0.0, "--adam-eps must be > 0");
  MG_REQUIRE(cfg.sgd_momentum >= 0.0, "--sgd-momentum must be >= 0");
  pieces_ = buffer.layout().shard_pieces(buffer.dp().rank());
  const int64_t n = buffer.layout().total_shard_size();
  const Device dev = buffer.param_data().device();
  main_ = Tensor::zeros({n}, DType::F32, dev);
  exp_avg_ = Tensor::zeros({n}, DType::F32, dev);
  if (cfg.type == OptimizerType::Adam) exp_avg_sq_ = Tensor::zeros({n}, DType::F32, dev);
  reload_main_from_model();
}

void DistributedOptimizer::reload_main_from_model() {
  buffer_.finish_param_sync();
  const Tensor params = buffer_.param_data();
  for (const BufferLayout::Piece& p : pieces_)
    main_.narrow(0, p.shard_offset, p.length).copy_(params.narrow(0, p.buffer_offset, p.length));
}

void DistributedOptimizer::copy_main_to_model() {
  buffer_.finish_param_sync();  // a pending gather still reads this rank's shard
  const Tensor params = buffer_.param_data();
  for (const BufferLayout::Piece& p : pieces_)
    params.narrow(0, p.buffer_offset, p.length).copy_(main_.narrow(0, p.shard_offset, p.length));
  buffer_.all_gather_params();
}

std::vector<StatePiece> DistributedOptimizer::state_pieces() {
  const bool fp32_model = buffer_.param_data().dtype() == DType::F32;
  std::vector<StatePiece> out;
  for (const BufferLayout::Piece& p : pieces_) {
    StatePiece s;
    s.param = p.param;
    s.param_offset = p.param_offset;
    s.length = p.length;
    s.shard_offset = p.shard_offset;
    if (!fp32_model) s.main = main_.narrow(0, p.shard_offset, p.length);
    s.exp_avg = exp_avg_.narrow(0, p.shard_offset, p.length);
    if (exp_avg_sq_.defined()) s.exp_avg_sq = exp_avg_sq_.narrow(0, p.shard_offset, p.length);
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<ShardBuffers> DistributedOptimizer::shard() const {
  const bool fp32_model = buffer_.param_data().dtype() == DType::F32;
  return ShardBuffers{fp32_model ? Tensor() : main_, exp_avg_, exp_avg_sq_};
}

void DistributedOptimizer::set_decoupled_lr_params(std::vector<bool> flags) {
  MG_CHECK(flags.empty() || flags.size() == buffer_.parameters().size(), "one decoupled-LR flag per parameter");
  decoupled_ = std::move(flags);
}

StepResult DistributedOptimizer::step(double lr, double weight_decay, GradScaler& scaler,
                                      double decoupled_lr) {
  StepResult r;
  // The previous step's gathers (--overlap-param-gather) read this rank's shard, which the update
  // below overwrites; the forward normally waited for all of them already.
  buffer_.finish_param_sync();
  const Tensor grads = buffer_.main_grad_shard();
  const double inv = scaler.inv_scale();
  if (inv != 1.0) scale_inplace(grads, float(inv));
  const bool local_finite = ops::all_finite(grads);
  double local_sq = 0.0;
  if (local_finite) {
    const model::ParameterList& params = buffer_.parameters();
    for (const BufferLayout::Piece& p : pieces_)
      if (model::param_counts_in_grad_norm(*params[p.param], tp_rank_))
        local_sq += ops::l2_norm_squared(grads.narrow(0, p.shard_offset, p.length));
  }
  const auto [nonfinite, sum_sq] = reduce_grad_stats(&grad_stats_, !local_finite, local_sq);
  scaler.update(nonfinite);
  if (nonfinite) {
    r.skipped = true;
    r.grad_norm = std::nan("");
    return r;
  }
  r.grad_norm = std::sqrt(sum_sq);
  if (cfg_.clip_grad > 0.0) {
    const double coeff = cfg_.clip_grad / (r.grad_norm + 1e-6);
    if (coeff < 1.0) scale_inplace(grads, float(coeff));
  }
  ++step_count_;
  const model::ParameterList& params = buffer_.parameters();
  const Tensor pbuf = buffer_.param_data();
  for (const BufferLayout::Piece& p : pieces_) {
    const double wd = params[p.param]->weight_decay ? weight_decay : 0.0;
    const Tensor main = main_.narrow(0, p.shard_offset, p.length);
    const Tensor g = grads.narrow(0, p.shard_offset, p.length);
    const Tensor m = exp_avg_.narrow(0, p.shard_offset, p.length);
    const Tensor model_copy = pbuf.narrow(0, p.buffer_offset, p.length);
    const Tensor v = cfg_.type == OptimizerType::Adam
                         ? exp_avg_sq_.narrow(0, p.shard_offset, p.length) : Tensor();
    const bool dec = !decoupled_.empty() && decoupled_[p.param];
    MG_CHECK(!dec || !std::isnan(decoupled_lr), "decoupled-LR parameter without a decoupled LR");
    update_parameter(cfg_, main, g, m, v, model_copy, dec ? decoupled_lr : lr, wd, step_count_);
  }
  buffer_.start_param_sync();
  return r;
}

}  // namespace megatron::optim
