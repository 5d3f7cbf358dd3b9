// Sharded AdamW/SGD over the flat data-parallel buffers (see distributed_optimizer.h).
#include "optim/distributed_optimizer.h"

#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/tensor_parallel.h"
#include "optim/update_rules.h"

namespace megatron::optim {

DistributedOptimizer::DistributedOptimizer(ParamAndGradBuffer& buffer, const OptimizerConfig& cfg,
                                           Communicator& grad_stats, int tp_rank)
    : DistributedOptimizer(buffer.parameters(), {BufferPart{&buffer, tp_rank}}, cfg, grad_stats) {}

DistributedOptimizer::DistributedOptimizer(model::ParameterList params,
                                           std::vector<BufferPart> buffers,
                                           const OptimizerConfig& cfg, Communicator& grad_stats)
    : params_(std::move(params)), cfg_(cfg), grad_stats_(grad_stats) {
  MG_CHECK(!buffers.empty(), "the distributed optimizer needs a buffer");
  MG_REQUIRE(cfg.clip_grad >= 0.0, "--clip-grad must be >= 0 (got ", cfg.clip_grad, ")");
  MG_REQUIRE(cfg.adam_beta1 >= 0.0 && cfg.adam_beta1 < 1.0, "--adam-beta1 must be in [0, 1)");
  MG_REQUIRE(cfg.adam_beta2 >= 0.0 && cfg.adam_beta2 < 1.0, "--adam-beta2 must be in [0, 1)");
  MG_REQUIRE(cfg.adam_eps > 0.0, "--adam-eps must be > 0");
  MG_REQUIRE(cfg.sgd_momentum >= 0.0, "--sgd-momentum must be >= 0");
  std::unordered_map<const model::Parameter*, size_t> model_index;
  for (size_t i = 0; i < params_.size(); ++i) model_index[params_[i]] = i;
  int64_t n = 0;
  size_t held = 0;
  for (const BufferPart& b : buffers) {
    MG_CHECK(b.buffer != nullptr && b.buffer->sharded(),
             "the distributed optimizer needs buffers padded for sharding");
    Part part{b.buffer, b.tp_rank, n, b.buffer->layout().shard_pieces(b.buffer->dp().rank())};
    const model::ParameterList& mine = b.buffer->parameters();
    for (BufferLayout::Piece& p : part.pieces) {
      auto it = model_index.find(mine[p.param]);
      MG_CHECK(it != model_index.end(), "distributed optimizer: ", mine[p.param]->name,
               " is in a buffer but not among the parameters");
      p.param = it->second;
      p.shard_offset += n;
    }
    held += mine.size();
    n += b.buffer->layout().total_shard_size();
    parts_.push_back(std::move(part));
  }
  MG_CHECK(held == params_.size(), "distributed optimizer: the buffers hold ", held, " of ",
           params_.size(), " parameters");
  const Device dev = parts_.front().buffer->param_data().device();
  main_ = Tensor::zeros({n}, DType::F32, dev);
  exp_avg_ = Tensor::zeros({n}, DType::F32, dev);
  if (cfg.type == OptimizerType::Adam) exp_avg_sq_ = Tensor::zeros({n}, DType::F32, dev);
  reload_main_from_model();
}

void DistributedOptimizer::zero_grad() {
  for (const Part& part : parts_) part.buffer->zero_grad();
}

void DistributedOptimizer::finish_param_sync() {
  for (const Part& part : parts_) part.buffer->finish_param_sync();
}

void DistributedOptimizer::reload_main_from_model() {
  for (const Part& part : parts_) {
    part.buffer->finish_param_sync();
    const Tensor params = part.buffer->param_data();
    for (const BufferLayout::Piece& p : part.pieces)
      main_.narrow(0, p.shard_offset, p.length).copy_(params.narrow(0, p.buffer_offset, p.length));
  }
}

void DistributedOptimizer::copy_main_to_model() {
  for (const Part& part : parts_) {
    part.buffer->finish_param_sync();  // a pending gather still reads this rank's shard
    const Tensor params = part.buffer->param_data();
    for (const BufferLayout::Piece& p : part.pieces)
      params.narrow(0, p.buffer_offset, p.length).copy_(main_.narrow(0, p.shard_offset, p.length));
    part.buffer->all_gather_params();
  }
}

std::vector<StatePiece> DistributedOptimizer::state_pieces() {
  const bool fp32_model = parts_.front().buffer->param_data().dtype() == DType::F32;
  std::vector<StatePiece> out;
  for (const Part& part : parts_)
    for (const BufferLayout::Piece& p : part.pieces) {
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
  const bool fp32_model = parts_.front().buffer->param_data().dtype() == DType::F32;
  return ShardBuffers{fp32_model ? Tensor() : main_, exp_avg_, exp_avg_sq_};
}

void DistributedOptimizer::set_decoupled_lr_params(std::vector<bool> flags) {
  MG_CHECK(flags.empty() || flags.size() == params_.size(), "one decoupled-LR flag per parameter");
  decoupled_ = std::move(flags);
}

StepResult DistributedOptimizer::step(double lr, double weight_decay, GradScaler& scaler,
                                      double decoupled_lr) {
  StepResult r;
  // The previous step's gathers (--overlap-param-gather) read this rank's shard, which the update
  // below overwrites; the forward normally waited for all of them already.
  finish_param_sync();
  const double inv = scaler.inv_scale();
  bool local_finite = true;
  for (const Part& part : parts_) {
    const Tensor grads = part.buffer->main_grad_shard();
    if (inv != 1.0) scale_inplace(grads, float(inv));
    local_finite = local_finite && ops::all_finite(grads);
  }
  double local_sq = 0.0;
  if (local_finite) {
    std::vector<Tensor> counted;  // summed in this order, read back from the device once
    for (const Part& part : parts_) {
      const Tensor grads = part.buffer->main_grad_shard();
      for (const BufferLayout::Piece& p : part.pieces)
        if (model::param_counts_in_grad_norm(*params_[p.param], part.tp_rank))
          counted.push_back(grads.narrow(0, p.shard_offset - part.base, p.length));
    }
    for (const double sq : ops::l2_norm_squared_each(counted)) local_sq += sq;
  }
  const auto [nonfinite, sum_sq] = reduce_grad_stats(&grad_stats_, !local_finite, local_sq);
  scaler.update(nonfinite);
  if (nonfinite) {
    r.skipped = true;
    r.grad_norm = std::nan("");
    return r;
  }
  r.grad_norm = std::sqrt(sum_sq);
  // Clipping scales each gradient as the update reads it (update_parameter_scaled).
  float clip = 1.0f;
  if (cfg_.clip_grad > 0.0) {
    const double coeff = cfg_.clip_grad / (r.grad_norm + 1e-6);
    if (coeff < 1.0) clip = float(coeff);
  }
  ++step_count_;
  for (const Part& part : parts_) {
    const Tensor grads = part.buffer->main_grad_shard();
    const Tensor pbuf = part.buffer->param_data();
    for (const BufferLayout::Piece& p : part.pieces) {
      const double wd = params_[p.param]->weight_decay ? weight_decay : 0.0;
      const Tensor main = main_.narrow(0, p.shard_offset, p.length);
      const Tensor g = grads.narrow(0, p.shard_offset - part.base, p.length);
      const Tensor m = exp_avg_.narrow(0, p.shard_offset, p.length);
      const Tensor model_copy = pbuf.narrow(0, p.buffer_offset, p.length);
      const Tensor v = cfg_.type == OptimizerType::Adam
                           ? exp_avg_sq_.narrow(0, p.shard_offset, p.length) : Tensor();
      const bool dec = !decoupled_.empty() && decoupled_[p.param];
      MG_CHECK(!dec || !std::isnan(decoupled_lr), "decoupled-LR parameter without a decoupled LR");
      update_parameter_scaled(cfg_, main, g, m, v, model_copy, dec ? decoupled_lr : lr, wd,
                              step_count_, clip);
    }
  }
  for (const Part& part : parts_) part.buffer->start_param_sync();
  return r;
}

}  // namespace megatron::optim
