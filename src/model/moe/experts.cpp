// The sequential experts (see experts.h).
#include "model/moe/experts.h"

namespace megatron::model {

SequentialExperts::SequentialExperts(const std::string& prefix, const TransformerConfig& cfg,
                                     const MlpSpec& spec, const TensorParallel& tp, bool grad) {
  for (int e = 0; e < cfg.num_moe_experts; ++e) {
    experts_.push_back(std::make_unique<MLP>(prefix + ".local_experts." + std::to_string(e), cfg,
                                             spec, tp, grad, cfg.moe_ffn()));
    for (Parameter* p : experts_.back()->parameters()) p->expert = e;
    register_child(*experts_.back());
  }
}

Tensor SequentialExperts::forward(const LayerContext& ctx, const Tensor& xp,
                                  const std::vector<int64_t>& counts) {
  Tensor y = Tensor::empty(xp.shape(), DType::F32, xp.device());
  int64_t off = 0;
  for (size_t e = 0; e < experts_.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    y.narrow(0, off, n).copy_(experts_[e]->forward(ctx, xp.narrow(0, off, n)));
    off += n;
  }
  return y;
}

Tensor SequentialExperts::backward(const LayerContext& ctx, const Tensor& dyp,
                                   const std::vector<int64_t>& counts) {
  Tensor dx = Tensor::empty(dyp.shape(), DType::F32, dyp.device());
  int64_t off = 0;
  for (size_t e = 0; e < experts_.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    dx.narrow(0, off, n).copy_(experts_[e]->backward(ctx, dyp.narrow(0, off, n)));
    off += n;
  }
  return dx;
}

}  // namespace megatron::model
