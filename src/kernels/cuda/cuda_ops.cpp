// The CUDA backend's op table: the ops with a CUDA kernel (cuda_backend.h), registered for
// DeviceType::CUDA by cuda::init. Every other op throws Error naming the op and the device. Built
// only with the CUDA backend (MEGATRON_HAVE_CUDA).
#ifdef MEGATRON_HAVE_CUDA

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace megatron::cuda {

namespace {

// Adapters from the one-tensor ops to the multi-tensor kernels.
void adamw_step_one(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const Tensor& model_copy,
                    const ops::AdamWConfig& cfg) {
  adamw_multi_tensor({AdamWTensors{master, grad, exp_avg, exp_avg_sq, model_copy}}, cfg);
}

// The reductions' kernels read fp32: a bf16/fp16 tensor is cast on the device first.
Tensor as_f32(const Tensor& x) {
  if (x.dtype() == DType::F32) return x;
  MG_REQUIRE(x.dtype() == DType::BF16 || x.dtype() == DType::F16, "the CUDA reductions take "
             "fp32, bf16 or fp16 tensors, got ", dtype_name(x.dtype()));
  Tensor f = Tensor::empty(x.shape(), DType::F32, x.device());
  cast(f, x);
  return f;
}
// The kind-taking ops: the kinds with a CUDA kernel (LayerNorm; GeLU in both forms); any other
// kind throws Error naming the op, the kind and the device.
void norm_fwd(model::NormId kind, const Tensor& out, const Tensor& mean, const Tensor& rstd,
              const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  if (kind != model::NormId::layernorm)
    ops::detail::throw_no_kind_kernel("norm_fwd", kind, x.device());
  layernorm_fwd(out, mean, rstd, x, weight, bias, eps);
}
void norm_bwd(model::NormId kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
              const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
              const Tensor& rstd, bool accumulate_dx) {
  if (kind != model::NormId::layernorm)
    ops::detail::throw_no_kind_kernel("norm_bwd", kind, x.device());
  layernorm_bwd(dx, dweight, dbias, dout, x, weight, mean, rstd, accumulate_dx);
}
bool is_gelu(model::ActivationId kind) {
  return kind == model::ActivationId::gelu || kind == model::ActivationId::gelu_tanh;
}
void activation_fwd(model::ActivationId kind, const Tensor& out, const Tensor& x) {
  if (!is_gelu(kind)) ops::detail::throw_no_kind_kernel("activation_fwd", kind, x.device());
  gelu_fwd(out, x, kind == model::ActivationId::gelu_tanh);
}
void activation_bwd(model::ActivationId kind, const Tensor& dx, const Tensor& dout,
                    const Tensor& x) {
  if (!is_gelu(kind)) ops::detail::throw_no_kind_kernel("activation_bwd", kind, x.device());
  gelu_bwd(dx, dout, x, kind == model::ActivationId::gelu_tanh);
}

double l2_norm_squared_one(const Tensor& x) { return l2_norm_squared({as_f32(x)}); }
bool all_finite_one(const Tensor& x) { return all_finite({as_f32(x)}); }

// Designated initializers follow MG_FOR_EACH_OP's order.
constinit const ops::OpTable kOps = {
    .gemm = &cuda::gemm,
    .gemm_batched = &cuda::gemm_batched,
    .embedding_fwd = &cuda::embedding_fwd,
    .embedding_bwd = &cuda::embedding_bwd,
    .norm_fwd = &norm_fwd,
    .norm_bwd = &norm_bwd,
    .activation_fwd = &activation_fwd,
    .activation_bwd = &activation_bwd,
    .bias_add = &cuda::bias_add,
    .bias_grad = &cuda::bias_grad,
    .add = &cuda::add,
    .scale = &cuda::scale,
    .dropout_fwd = &cuda::dropout_fwd,
    .dropout_bwd = &cuda::dropout_bwd,
    .bias_dropout_add_fwd = &cuda::bias_dropout_add_fwd,
    .bias_dropout_add_bwd = &cuda::bias_dropout_add_bwd,
    .softmax_xent_fwd_bwd = &cuda::softmax_xent_fwd_bwd,
    .adamw_step = &adamw_step_one,
    .l2_norm_squared = &l2_norm_squared_one,
    .all_finite = &all_finite_one,
    .cast = &cuda::cast,
};

}  // namespace

const ops::OpTable& op_table() { return kOps; }

}  // namespace megatron::cuda

#endif  // MEGATRON_HAVE_CUDA
