// Forward and backward of the normalization layer: ops::norm_fwd / norm_bwd with the kind from
// the spec (see norm.h).
#include "model/norm.h"

#include "kernels/ops.h"

namespace megatron::model {

Norm::Norm(const std::string& prefix, int64_t h, const NormKind& k, DType dtype,
           const NormOptions& opt)
    : kind(k), eps(opt.eps) {
  weight.offset = opt.zero_centered_gamma ? 1.0f : 0.0f;
  WeightSpec w;
  w.name = prefix + ".weight";
  w.init = opt.zero_centered_gamma ? InitMethod::zeros : InitMethod::ones;
  w.weight_decay = false;
  w.sequence_parallel = opt.partial_grad;
  weight.init(w, {h}, dtype, opt.grad);
  if (!opt.zero_centered_gamma) weight.param.value.fill_(1.0);
  if (kind.has_bias) {
    WeightSpec b = w;
    b.name = prefix + ".bias";
    b.init = InitMethod::zeros;
    bias.init(b, {h}, dtype, opt.grad);
  }
  register_weight(weight);
  register_weight(bias);
  weight.refresh();
}

Tensor Norm::forward(const LayerContext& ctx, const Tensor& x, DType out_dtype) {
  MG_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16, "Norm ", weight.param.name,
           ": output dtype ", dtype_name(out_dtype), " (float32 or bfloat16)");
  const int64_t n = x.size(0);
  Tensor out = Tensor::empty(x.shape(), out_dtype, x.device());
  Tensor mean, rstd;
  if (ctx.save) {
    if (kind.saves_mean) mean = Tensor::empty({n}, DType::F32, x.device());
    rstd = Tensor::empty({n}, DType::F32, x.device());
  }
  ops::norm_fwd(kind.id, out, mean, rstd, x, weight.f32, bias.defined() ? bias.f32 : Tensor(), eps);
  if (ctx.save) {
    x_ = x;
    mean_ = mean;
    rstd_ = rstd;
  }
  return out;
}

void Norm::run_backward(const Tensor& dx, const Tensor& dout, bool accumulate) {
  MG_CHECK(rstd_.defined(), "Norm::backward without a saved forward");
  ops::norm_bwd(kind.id, dx, weight.param.grad, bias.defined() ? bias.param.grad : Tensor(), dout,
                x_, weight.f32, mean_, rstd_, accumulate);
  x_.reset();
  mean_.reset();
  rstd_.reset();
}

void Norm::backward_accumulate(const LayerContext&, const Tensor& dout, const Tensor& dx) {
  run_backward(dx, dout, true);
}

Tensor Norm::backward(const LayerContext&, const Tensor& dout) {
  Tensor dx = Tensor::empty(dout.shape(), DType::F32, dout.device());
  run_backward(dx, dout, false);
  return dx;
}

}  // namespace megatron::model
