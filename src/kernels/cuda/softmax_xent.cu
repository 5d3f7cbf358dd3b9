// Fused softmax + cross-entropy over the vocabulary, forward and backward in one kernel: one
// block per token row reads the logits once for the (online) max and sum of exponentials, then
// once more to overwrite them with the gradient. The probabilities are never stored separately.
// A label outside [0, V) is an Error naming it, as on the CPU (one small copy back).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::require_f32;
using detail::stream;

namespace {

constexpr int kThreads = 512;

__global__ void softmax_xent_kernel(float* logits, int64_t row_stride, int64_t V, float* loss,
                                    const int32_t* labels, const float* mask, float grad_scale,
                                    bool write_grad) {
  __shared__ float shared[32];
  __shared__ float s_max, s_sum;
  const int64_t row = blockIdx.x;
  float* lr = logits + row * row_stride;
  // Online max / sum of exp per thread, then combined across the block.
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = lr[j];
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float bm = detail::block_max(m, shared);
  const float scaled = m == -INFINITY ? 0.0f : s * expf(m - bm);
  const float bs = detail::block_sum(scaled, shared);
  if (threadIdx.x == 0) {
    s_max = bm;
    s_sum = bs;
  }
  __syncthreads();
  const float lse = s_max + logf(s_sum);
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < V;
  if (threadIdx.x == 0) loss[row] = valid ? lse - lr[label] : NAN;
  if (!write_grad) return;
  __syncthreads();  // the loss read lr[label] before it is overwritten
  const float g = grad_scale * (mask ? mask[row] : 1.0f);
  const float inv = 1.0f / s_sum;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(lr[j] - s_max) * inv;
    lr[j] = g * (p - (j == label ? 1.0f : 0.0f));
  }
}

}  // namespace

void softmax_xent_fwd_bwd(const Tensor& logits, const Tensor& loss, const Tensor& labels,
                          const Tensor& loss_mask, float grad_scale, bool write_grad) {
  const char* op = "softmax_xent_fwd_bwd";
  MG_CHECK(logits.defined() && logits.device().is_cuda() && logits.dtype() == DType::F32 &&
               logits.dim() == 2 && logits.stride(1) == 1,
           op, ": logits must be a 2-D fp32 CUDA tensor with unit inner stride");
  require_f32(op, "loss", loss);
  detail::require_cuda(op, "labels", labels);
  MG_CHECK(labels.dtype() == DType::I32, op, ": labels must be int32");
  const int64_t n = logits.size(0), V = logits.size(1);
  MG_CHECK(loss.numel() == n && labels.numel() == n, op, ": inconsistent sizes");
  const float* mask = nullptr;
  if (loss_mask.defined()) {
    require_f32(op, "loss_mask", loss_mask);
    MG_CHECK(loss_mask.numel() == n, op, ": loss_mask size");
    mask = loss_mask.data<float>();
  }
  const detail::BadId bad = detail::first_id_outside(labels, 0, V);
  MG_REQUIRE(bad.position < 0, "label ", bad.value, " at position ", bad.position,
             " is outside the vocabulary [0, ", V, ")");
  if (n == 0) return;
  softmax_xent_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
      logits.data<float>(), logits.stride(0), V, loss.data<float>(), labels.data<int32_t>(), mask,
      grad_scale, write_grad);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
