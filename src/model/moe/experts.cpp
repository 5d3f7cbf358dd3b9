// The sequential experts (see experts.h).
#include "model/moe/experts.h"

#include "kernels/op_profile.h"

namespace megatron::model {

SequentialExperts::SequentialExperts(const std::string& prefix, const TransformerConfig& cfg,
                                     const MlpSpec& spec, const TensorParallel& tp, bool grad) {
  const int ep = tp.ep_size();
  MG_REQUIRE(cfg.num_moe_experts % ep == 0, "--num-experts ", cfg.num_moe_experts,
             " is not divisible by --expert-model-parallel-size ", ep);
  const int local = cfg.num_moe_experts / ep;
  first_ = tp.ep_rank() * local;
  for (int e = first_; e < first_ + local; ++e) {
    experts_.push_back(std::make_unique<MLP>(prefix + ".local_experts." + std::to_string(e), cfg,
                                             spec, tp, grad, cfg.moe_ffn()));
    for (Parameter* p : experts_.back()->parameters()) p->expert = e;
    register_child(*experts_.back());
  }
}

namespace {

// out's block of expert e's rows = fn(e, in's block), for every expert given rows.
template <class Fn>
Tensor per_expert_rows(const Tensor& in, const std::vector<int64_t>& counts, Fn&& fn) {
  Tensor out = Tensor::empty(in.shape(), DType::F32, in.device());
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    out.narrow(0, off, n).copy_(fn(e, in.narrow(0, off, n)));
    off += n;
  }
  return out;
}

}  // namespace

Tensor SequentialExperts::forward(const LayerContext& ctx, const Tensor& xp,
                                  const std::vector<int64_t>& counts) {
  const ops::profile::Scope profile("moe experts (sequential)");
  return per_expert_rows(xp, counts,
                         [&](size_t e, const Tensor& x) { return experts_[e]->forward(ctx, x); });
}

Tensor SequentialExperts::backward(const LayerContext& ctx, const Tensor& dyp,
                                   const std::vector<int64_t>& counts) {
  const ops::profile::Scope profile("moe experts (sequential), bwd");
  return per_expert_rows(dyp, counts,
                         [&](size_t e, const Tensor& dy) { return experts_[e]->backward(ctx, dy); });
}

}  // namespace megatron::model
