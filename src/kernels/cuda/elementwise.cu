// Element-wise CUDA kernels: GELU, bias, add/scale, dropout (the CPU's Philox masks), casts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/rng.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::grid_for;
using detail::require_f32;
using detail::require_same_numel;
using detail::stream;

namespace {

constexpr int kThreads = 256;

#define MG_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__device__ inline float gelu_f(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
  }
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

__device__ inline float gelu_grad_f(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float k = 0.7978845608028654f;
    const float u = k * (x + 0.044715f * x * x * x);
    const float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
  }
  const float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
  const float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

__global__ void gelu_fwd_kernel(float* out, const float* x, int64_t n, bool tanh_approx) {
  MG_GRID_STRIDE(i, n) out[i] = gelu_f(x[i], tanh_approx);
}

__global__ void gelu_bwd_kernel(float* dx, const float* dout, const float* x, int64_t n,
                                bool tanh_approx) {
  MG_GRID_STRIDE(i, n) dx[i] = dout[i] * gelu_grad_f(x[i], tanh_approx);
}

__global__ void bias_add_kernel(float* x, const float* bias, int64_t n, int64_t m) {
  MG_GRID_STRIDE(i, n) x[i] += bias[i % m];
}

// One thread per column, rows summed in order: deterministic.
__global__ void bias_grad_kernel(float* dbias, const float* dout, int64_t rows, int64_t m) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= m) return;
  float s = 0.0f;
  for (int64_t r = 0; r < rows; ++r) s += dout[r * m + c];
  dbias[c] += s;
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  MG_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  MG_GRID_STRIDE(i, n) x[i] *= s;
}

// out = residual + dropout(x + bias); the keep decision for element i is the CPU's:
// uniform(element_offset + i) of Philox(seed, stream) >= p, kept values scaled by 1/(1-p).
__global__ void dropout_kernel(float* out, const float* x, const float* bias, int64_t m,
                               const float* residual, int64_t n, float p, uint64_t seed,
                               uint64_t stream_id, uint64_t offset) {
  const float s = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  MG_GRID_STRIDE(i, n) {
    float v = x[i];
    if (bias) v += bias[i % m];
    if (p > 0.0f) {
      const float u = philox_word_to_uniform(philox_u32(seed, stream_id, offset + uint64_t(i)));
      v = u >= p ? v * s : 0.0f;
    }
    if (residual) v += residual[i];
    out[i] = v;
  }
}

template <typename T>
__device__ inline float load_f(const T* p, int64_t i);
template <>
__device__ inline float load_f<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ inline float load_f<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ inline float load_f<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }

template <typename T>
__device__ inline void store_f(T* p, int64_t i, float v);
template <>
__device__ inline void store_f<float>(float* p, int64_t i, float v) { p[i] = v; }
template <>
__device__ inline void store_f<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <>
__device__ inline void store_f<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  MG_GRID_STRIDE(i, n) store_f<D>(dst, i, load_f<S>(src, i));
}

template <typename D, typename S>
void launch_cast(const Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  cast_kernel<D, S><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      static_cast<D*>(dst.raw_data()), static_cast<const S*>(src.raw_data()), n);
}

template <typename D>
void cast_from(const Tensor& dst, const Tensor& src) {
  switch (src.dtype()) {
    case DType::F32: return launch_cast<D, float>(dst, src);
    case DType::BF16: return launch_cast<D, __nv_bfloat16>(dst, src);
    case DType::F16: return launch_cast<D, __half>(dst, src);
    default: MG_THROW("cuda::cast: unsupported source dtype ", dtype_name(src.dtype()));
  }
}

void launch_dropout(const char* op, const Tensor& out, const Tensor& x, const Tensor& bias,
                    const Tensor& residual, const ops::DropoutSpec& d) {
  require_f32(op, "out", out);
  require_f32(op, "x", x);
  require_same_numel(op, out, x);
  MG_CHECK(d.p >= 0.0f && d.p < 1.0f, op, ": dropout probability ", d.p, " outside [0, 1)");
  const float* b = nullptr;
  int64_t m = 1;
  if (bias.defined()) {
    require_f32(op, "bias", bias);
    m = bias.numel();
    MG_CHECK(x.size(-1) == m, op, ": bias size mismatch");
    b = bias.data<float>();
  }
  const float* r = nullptr;
  if (residual.defined()) {
    require_f32(op, "residual", residual);
    require_same_numel(op, out, residual);
    r = residual.data<float>();
  }
  const int64_t n = x.numel();
  dropout_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      out.data<float>(), x.data<float>(), b, m, r, n, d.p, d.seed, d.stream, d.element_offset);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace

void gelu_fwd(const Tensor& out, const Tensor& x, bool tanh_approx) {
  require_f32("cuda::gelu_fwd", "out", out);
  require_f32("cuda::gelu_fwd", "x", x);
  require_same_numel("cuda::gelu_fwd", out, x);
  const int64_t n = x.numel();
  gelu_fwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out.data<float>(),
                                                                    x.data<float>(), n, tanh_approx);
  MG_CUDA_LAUNCH_CHECK();
}

void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx) {
  require_f32("cuda::gelu_bwd", "dx", dx);
  require_f32("cuda::gelu_bwd", "dout", dout);
  require_f32("cuda::gelu_bwd", "x", x);
  require_same_numel("cuda::gelu_bwd", dx, x);
  require_same_numel("cuda::gelu_bwd", dout, x);
  const int64_t n = x.numel();
  gelu_bwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      dx.data<float>(), dout.data<float>(), x.data<float>(), n, tanh_approx);
  MG_CUDA_LAUNCH_CHECK();
}

void bias_add(const Tensor& x, const Tensor& bias) {
  require_f32("cuda::bias_add", "x", x);
  require_f32("cuda::bias_add", "bias", bias);
  MG_CHECK(x.size(-1) == bias.numel(), "cuda::bias_add: bias size mismatch");
  const int64_t n = x.numel();
  bias_add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x.data<float>(),
                                                                    bias.data<float>(), n,
                                                                    bias.numel());
  MG_CUDA_LAUNCH_CHECK();
}

void bias_grad(const Tensor& dbias, const Tensor& dout) {
  require_f32("cuda::bias_grad", "dbias", dbias);
  require_f32("cuda::bias_grad", "dout", dout);
  const int64_t m = dbias.numel();
  MG_CHECK(dout.size(-1) == m, "cuda::bias_grad: size mismatch");
  bias_grad_kernel<<<grid_for(m, kThreads), kThreads, 0, stream()>>>(
      dbias.data<float>(), dout.data<float>(), dout.numel() / m, m);
  MG_CUDA_LAUNCH_CHECK();
}

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  require_f32("cuda::add", "out", out);
  require_f32("cuda::add", "a", a);
  require_f32("cuda::add", "b", b);
  require_same_numel("cuda::add", out, a);
  require_same_numel("cuda::add", out, b);
  const int64_t n = out.numel();
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out.data<float>(), a.data<float>(),
                                                               b.data<float>(), n);
  MG_CUDA_LAUNCH_CHECK();
}

void scale(const Tensor& x, float s) {
  require_f32("cuda::scale", "x", x);
  const int64_t n = x.numel();
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x.data<float>(), s, n);
  MG_CUDA_LAUNCH_CHECK();
}

void dropout_fwd(const Tensor& out, const Tensor& x, const ops::DropoutSpec& d) {
  launch_dropout("cuda::dropout_fwd", out, x, Tensor(), Tensor(), d);
}

void dropout_bwd(const Tensor& dx, const Tensor& dout, const ops::DropoutSpec& d) {
  launch_dropout("cuda::dropout_bwd", dx, dout, Tensor(), Tensor(), d);
}

void bias_dropout_add_fwd(const Tensor& out, const Tensor& x, const Tensor& bias,
                          const Tensor& residual, const ops::DropoutSpec& d) {
  launch_dropout("cuda::bias_dropout_add_fwd", out, x, bias, residual, d);
}

void bias_dropout_add_bwd(const Tensor& dx, const Tensor& dbias, const Tensor& dout,
                          const ops::DropoutSpec& d) {
  launch_dropout("cuda::bias_dropout_add_bwd", dx, dout, Tensor(), Tensor(), d);
  if (dbias.defined()) bias_grad(dbias, dx);
}

void cast(const Tensor& dst, const Tensor& src) {
  detail::require_cuda("cuda::cast", "dst", dst);
  detail::require_cuda("cuda::cast", "src", src);
  require_same_numel("cuda::cast", dst, src);
  switch (dst.dtype()) {
    case DType::F32: cast_from<float>(dst, src); break;
    case DType::BF16: cast_from<__nv_bfloat16>(dst, src); break;
    case DType::F16: cast_from<__half>(dst, src); break;
    default: MG_THROW("cuda::cast: unsupported destination dtype ", dtype_name(dst.dtype()));
  }
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
