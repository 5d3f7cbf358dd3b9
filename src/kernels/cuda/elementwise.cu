// Element-wise CUDA kernels: bias, add/scale, tanh, dropout (the CPU's Philox masks), casts. (The norms
// are in norm.cu, the activations in activation.cu.)
#include <algorithm>
#include <type_traits>

#include "core/rng.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::grid_for;
using detail::load_f;
using detail::require_f32;
using detail::require_same_numel;
using detail::store_f;
using detail::stream;

namespace {

constexpr int kThreads = 256;

// x [rows, m] += bias [m]: a thread per column (4 columns with float4 when m % 4 == 0) walking
// rows blockIdx.y, + gridDim.y, ...: no index division.
template <int W>
__global__ void bias_add_kernel(float* x, const float* bias, int64_t rows, int64_t m) {
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W;
  if (c >= m) return;
  if constexpr (W == 4) {
    const float4 b = *reinterpret_cast<const float4*>(bias + c);
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
      float4* p = reinterpret_cast<float4*>(x + r * m + c);
      float4 v = *p;
      v.x += b.x;
      v.y += b.y;
      v.z += b.z;
      v.w += b.w;
      *p = v;
    }
  } else {
    const float b = bias[c];
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) x[r * m + c] += b;
  }
}

// Column sums in two passes, deterministic (a fixed order): partial[chunk, c] sums the chunk's
// rows in order (one thread per column and chunk, so a tall dout fills the GPU rather than one
// block per 256 columns), then each column adds its chunks in order.
constexpr int64_t kBiasRowsPerChunk = 64;

__global__ void bias_grad_partial_kernel(float* partial, const float* dout, int64_t rows,
                                         int64_t m, int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= m) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += dout[r * m + c];
  partial[blockIdx.y * m + c] = s;
}

__global__ void bias_grad_final_kernel(float* dbias, const float* partial, int64_t chunks,
                                       int64_t m) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= m) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * m + c];
  dbias[c] += s;
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  MG_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  MG_GRID_STRIDE(i, n) x[i] *= s;
}

__global__ void tanh_fwd_kernel(float* out, const float* x, int64_t n) {
  MG_GRID_STRIDE(i, n) out[i] = tanhf(x[i]);
}

// From the forward's output y: dx = dout (1 - y^2) (dx may alias dout).
__global__ void tanh_bwd_kernel(float* dx, const float* dout, const float* y, int64_t n) {
  MG_GRID_STRIDE(i, n) dx[i] = dout[i] * (1.0f - y[i] * y[i]);
}

// out = residual + dropout(x + bias); the keep decision for element i is the CPU's:
// uniform(element_offset + i) of Philox(seed, stream) >= p, kept values scaled by 1/(1-p).
// I: the index type, 32-bit when n fits (the bias column i % m is then a 32-bit division).
template <typename I>
__global__ void dropout_kernel(float* out, const float* x, const float* bias, I m,
                               const float* residual, I n, float p, uint64_t seed,
                               uint64_t stream_id, uint64_t offset) {
  const float s = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < n; i += I(gridDim.x) * I(blockDim.x)) {
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

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  MG_GRID_STRIDE(i, n) store_f<D>(dst, i, load_f<S>(src, i));
}

// fp32 -> bf16 (every product operand of a bf16 model), 8 elements a thread: two 16-byte loads,
// one 16-byte store.
__global__ void cast_f32_bf16_x8(uint4* dst, const float4* src, int64_t n8) {
  MG_GRID_STRIDE(i, n8) {
    const float4 a = src[2 * i], b = src[2 * i + 1];
    const __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y), p1 = __floats2bfloat162_rn(a.z, a.w),
                         p2 = __floats2bfloat162_rn(b.x, b.y), p3 = __floats2bfloat162_rn(b.z, b.w);
    dst[i] = make_uint4(*reinterpret_cast<const uint32_t*>(&p0),
                        *reinterpret_cast<const uint32_t*>(&p1),
                        *reinterpret_cast<const uint32_t*>(&p2),
                        *reinterpret_cast<const uint32_t*>(&p3));
  }
}

template <typename D, typename S>
void launch_cast(const Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  if constexpr (std::is_same_v<D, __nv_bfloat16> && std::is_same_v<S, float>) {
    const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (n % 8 == 0 && a16(dst.raw_data()) && a16(src.raw_data())) {
      cast_f32_bf16_x8<<<grid_for(n / 8, kThreads), kThreads, 0, stream()>>>(
          static_cast<uint4*>(dst.raw_data()), static_cast<const float4*>(src.raw_data()), n / 8);
      return;
    }
  }
  cast_kernel<D, S><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      static_cast<D*>(dst.raw_data()), static_cast<const S*>(src.raw_data()), n);
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
  if (n < (int64_t(1) << 31))
    dropout_kernel<uint32_t><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        out.data<float>(), x.data<float>(), b, uint32_t(m), r, uint32_t(n), d.p, d.seed,
        d.stream, d.element_offset);
  else
    dropout_kernel<int64_t><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        out.data<float>(), x.data<float>(), b, m, r, n, d.p, d.seed, d.stream, d.element_offset);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace

void bias_add(const Tensor& x, const Tensor& bias) {
  require_f32("cuda::bias_add", "x", x);
  require_f32("cuda::bias_add", "bias", bias);
  MG_CHECK(x.size(-1) == bias.numel(), "cuda::bias_add: bias size mismatch");
  const int64_t m = bias.numel(), rows = m > 0 ? x.numel() / m : 0;
  if (rows == 0 || m == 0) return;
  const bool wide = m % 4 == 0 && reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(bias.raw_data()) % 16 == 0;
  const int w = wide ? 4 : 1;
  const int64_t col_blocks = (m / w + kThreads - 1) / kThreads;
  // About 8 rows a thread, at most 65535 row blocks.
  const dim3 grid(unsigned(col_blocks), unsigned(std::min<int64_t>((rows + 7) / 8, 65535)));
  if (wide)
    bias_add_kernel<4><<<grid, kThreads, 0, stream()>>>(x.data<float>(), bias.data<float>(),
                                                        rows, m);
  else
    bias_add_kernel<1><<<grid, kThreads, 0, stream()>>>(x.data<float>(), bias.data<float>(),
                                                        rows, m);
  MG_CUDA_LAUNCH_CHECK();
}

void bias_grad(const Tensor& dbias, const Tensor& dout) {
  require_f32("cuda::bias_grad", "dbias", dbias);
  require_f32("cuda::bias_grad", "dout", dout);
  const int64_t m = dbias.numel();
  MG_CHECK(dout.size(-1) == m, "cuda::bias_grad: size mismatch");
  const int64_t rows = m == 0 ? 0 : dout.numel() / m;
  if (rows == 0 || m == 0) return;
  // Chunks of kBiasRowsPerChunk rows, larger when there would be more than a grid's 65535.
  const int64_t per_chunk = std::max<int64_t>(kBiasRowsPerChunk, (rows + 65534) / 65535);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  Tensor partial = Tensor::empty({chunks, m}, DType::F32, dbias.device());
  const unsigned col_blocks = unsigned((m + kThreads - 1) / kThreads);
  bias_grad_partial_kernel<<<dim3(col_blocks, unsigned(chunks)), kThreads, 0, stream()>>>(
      partial.data<float>(), dout.data<float>(), rows, m, per_chunk);
  MG_CUDA_LAUNCH_CHECK();
  bias_grad_final_kernel<<<col_blocks, kThreads, 0, stream()>>>(dbias.data<float>(),
                                                                partial.data<float>(), chunks, m);
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

void tanh_fwd(const Tensor& out, const Tensor& x) {
  require_f32("tanh_fwd", "x", x);
  require_f32("tanh_fwd", "out", out);
  require_same_numel("tanh_fwd", out, x);
  const int64_t n = x.numel();
  tanh_fwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out.data<float>(),
                                                                    x.data<float>(), n);
  MG_CUDA_LAUNCH_CHECK();
}

void tanh_bwd(const Tensor& dx, const Tensor& dout, const Tensor& out) {
  require_f32("tanh_bwd", "dout", dout);
  require_f32("tanh_bwd", "out", out);
  require_f32("tanh_bwd", "dx", dx);
  require_same_numel("tanh_bwd", dout, out);
  require_same_numel("tanh_bwd", dx, out);
  const int64_t n = out.numel();
  tanh_bwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      dx.data<float>(), dout.data<float>(), out.data<float>(), n);
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
  const char* op = "cuda::cast";
  detail::require_cuda(op, "dst", dst);
  detail::require_cuda(op, "src", src);
  require_same_numel(op, dst, src);
  if (src.numel() == 0) return;
  detail::with_float_type(op, src.dtype(), [&](auto src_tag) {
    using S = std::remove_cv_t<std::remove_pointer_t<decltype(src_tag)>>;
    detail::with_float_type(op, dst.dtype(), [&](auto dst_tag) {
      using D = std::remove_cv_t<std::remove_pointer_t<decltype(dst_tag)>>;
      if constexpr (std::is_same_v<S, double> && std::is_same_v<D, double>)
        MG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream()));
      else
        launch_cast<D, S>(dst, src);
    }, true);
  }, true);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
