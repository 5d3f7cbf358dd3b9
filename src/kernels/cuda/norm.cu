// The norms over the last dimension on the GPU (ops::norm_fwd / norm_bwd): one NormKernel<id> per
// kind of kernels/op_kinds.h (a kind without one does not compile: detail::with_kind). One block
// per row forward and for dx; the weight and bias gradients are reduced in two deterministic
// passes (per-chunk partial sums over rows in order, then the partials summed in chunk order).
// Row statistics in fp32, two-pass mean and variance for LayerNorm, as the CPU kernels.
#include <algorithm>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::f32_or_null;
using detail::stream;
using ops::NormId;

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerChunk = 64;

struct FwdArgs {
  int64_t h;
  const float *x, *w, *b;
  void* out;  // fp32, or bf16 (norm_fwd_kernel's O): rounded as ops::cast rounds
  float *mean, *rstd;
  float eps;
};
struct BwdArgs {
  int64_t n, h;
  const float *x, *w, *dout, *mean, *rstd;
  float *dx, *dw, *db;
  bool accumulate_dx;
};

// Per kind: fwd_row (one block, one row), xhat(x, mean, rstd) and, for dx, the two row sums it
// needs and the formula that uses them.
template <NormId K>
struct NormKernel;

template <>
struct NormKernel<NormId::layernorm> {
  template <class O>
  static __device__ void fwd_row(const FwdArgs& a, int64_t row, float* shared) {
    const float* xr = a.x + row * a.h;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x) s += xr[j];
    const float mean = detail::block_sum(s, shared) / float(a.h);
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x) v += (xr[j] - mean) * (xr[j] - mean);
    const float r = 1.0f / sqrtf(detail::block_sum(v, shared) / float(a.h) + a.eps);
    O* orow = static_cast<O*>(a.out) + row * a.h;
    for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x)
      detail::store_f(orow, j, (xr[j] - mean) * r * a.w[j] + a.b[j]);
    if (threadIdx.x == 0) {
      if (a.mean) a.mean[row] = mean;
      if (a.rstd) a.rstd[row] = r;
    }
  }
  static __device__ float xhat(float x, const float* mean, const float* rstd, int64_t row) {
    return (x - mean[row]) * rstd[row];
  }
  // dx = r (g w - mean(g w) - xhat mean(g w xhat))
  static __device__ float dx(float gw, float xh, float r, float mean_gw, float mean_gwx) {
    return r * (gw - mean_gw - xh * mean_gwx);
  }
};

template <>
struct NormKernel<NormId::rmsnorm> {
  template <class O>
  static __device__ void fwd_row(const FwdArgs& a, int64_t row, float* shared) {
    const float* xr = a.x + row * a.h;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x) s += xr[j] * xr[j];
    const float r = 1.0f / sqrtf(detail::block_sum(s, shared) / float(a.h) + a.eps);
    O* orow = static_cast<O*>(a.out) + row * a.h;
    for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x)
      detail::store_f(orow, j, xr[j] * r * a.w[j]);
    if (threadIdx.x == 0 && a.rstd) a.rstd[row] = r;
  }
  static __device__ float xhat(float x, const float*, const float* rstd, int64_t row) {
    return x * rstd[row];
  }
  // dx = r (g w - xhat mean(g w xhat))
  static __device__ float dx(float gw, float xh, float r, float, float mean_gwx) {
    return r * (gw - xh * mean_gwx);
  }
};

template <NormId K, class O>
__global__ void norm_fwd_kernel(FwdArgs a) {
  __shared__ float shared[32];
  NormKernel<K>::template fwd_row<O>(a, blockIdx.x, shared);
}

template <NormId K>
__global__ void norm_dx_kernel(BwdArgs a) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float *xr = a.x + row * a.h, *gr = a.dout + row * a.h;
  const float r = a.rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x) {
    const float gw = gr[j] * a.w[j];
    sg += gw;
    sgx += gw * NormKernel<K>::xhat(xr[j], a.mean, a.rstd, row);
  }
  const float mean_gw = detail::block_sum(sg, shared) / float(a.h);
  const float mean_gwx = detail::block_sum(sgx, shared) / float(a.h);
  float* dr = a.dx + row * a.h;
  for (int64_t j = threadIdx.x; j < a.h; j += blockDim.x) {
    const float xh = NormKernel<K>::xhat(xr[j], a.mean, a.rstd, row);
    const float v = NormKernel<K>::dx(gr[j] * a.w[j], xh, r, mean_gw, mean_gwx);
    dr[j] = a.accumulate_dx ? dr[j] + v : v;
  }
}

// partial_w[chunk, j] = the sum over the chunk's rows (in order) of dout * xhat; partial_b the
// sum of dout (when the kind has a bias).
template <NormId K>
__global__ void norm_dwb_partial_kernel(float* partial_w, float* partial_b, BwdArgs a,
                                        int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= a.h) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(a.n, r0 + rows_per_chunk);
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = a.dout[r * a.h + j];
    sw += g * NormKernel<K>::xhat(a.x[r * a.h + j], a.mean, a.rstd, r);
    sb += g;
  }
  partial_w[chunk * a.h + j] = sw;
  if (partial_b) partial_b[chunk * a.h + j] = sb;
}

__global__ void norm_dwb_final_kernel(float* dw, float* db, const float* partial_w,
                                      const float* partial_b, int64_t chunks, int64_t h) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= h) return;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += partial_w[c * h + j];
    if (db) sb += partial_b[c * h + j];
  }
  dw[j] += sw;
  if (db) db[j] += sb;
}

// The kind's row, and x [n, h] with weight [h]; a bias exactly when the kind has one, a saved
// mean only when it keeps one (the CPU kernels' checks).
const ops::NormOp& check_norm(const char* op, NormId kind, const Tensor& x,
                                  const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                  int64_t* n, int64_t* h) {
  const ops::NormOp* k = ops::find_norm_op(kind);
  if (k == nullptr) ops::detail::throw_no_kind_kernel(op, kind, x.device());
  detail::require_f32(op, "x", x);
  MG_CHECK(x.dim() >= 1, op, ": x must have at least one dim");
  *h = x.size(-1);
  *n = *h == 0 ? 0 : x.numel() / *h;
  f32_or_null<const float>(op, "weight", weight, *h, true);
  MG_CHECK(bias.defined() == k->has_bias, op, ": ", k->name,
           k->has_bias ? " needs a bias" : " has no bias");
  MG_CHECK(!mean.defined() || k->saves_mean, op, ": ", k->name, " saves no mean");
  return *k;
}

}  // namespace

void norm_fwd(NormId kind, const Tensor& out, const Tensor& mean, const Tensor& rstd,
              const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "norm_fwd";
  int64_t n = 0, h = 0;
  check_norm(op, kind, x, weight, bias, mean, &n, &h);
  const bool bf16_out = out.defined() && out.dtype() == DType::BF16;
  if (bf16_out)
    detail::require_bf16_output(op, out, x, n * h);
  const FwdArgs a{h,
                  x.data<float>(),
                  weight.data<float>(),
                  f32_or_null<const float>(op, "bias", bias, h, false),
                  bf16_out ? out.raw_data() : f32_or_null<float>(op, "out", out, n * h, true),
                  f32_or_null<float>(op, "mean", mean, n, false),
                  f32_or_null<float>(op, "rstd", rstd, n, false),
                  eps};
  if (n == 0) return;
  MG_CHECK(n < (int64_t(1) << 31), op, ": too many rows");
  detail::with_kind<ops::kNormOpCount>(op, kind, x.device(), [&]<NormId K>() {
    if (bf16_out)
      norm_fwd_kernel<K, __nv_bfloat16><<<unsigned(n), kThreads, 0, stream()>>>(a);
    else
      norm_fwd_kernel<K, float><<<unsigned(n), kThreads, 0, stream()>>>(a);
  });
  MG_CUDA_LAUNCH_CHECK();
}

void norm_bwd(NormId kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
              const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
              const Tensor& rstd, bool accumulate_dx) {
  const char* op = "norm_bwd";
  int64_t n = 0, h = 0;
  const ops::NormOp& k = check_norm(op, kind, x, weight, dbias, mean, &n, &h);
  MG_CHECK(!accumulate_dx || dx.raw_data() != dout.raw_data(), op,
           ": dx may not alias dout when accumulating");
  const BwdArgs a{n,
                  h,
                  x.data<float>(),
                  weight.data<float>(),
                  f32_or_null<const float>(op, "dout", dout, n * h, true),
                  f32_or_null<const float>(op, "mean", mean, n, k.saves_mean),
                  f32_or_null<const float>(op, "rstd", rstd, n, true),
                  f32_or_null<float>(op, "dx", dx, n * h, true),
                  f32_or_null<float>(op, "dweight", dweight, h, true),
                  f32_or_null<float>(op, "dbias", dbias, h, false),
                  accumulate_dx};
  if (n == 0) return;
  MG_CHECK(n < (int64_t(1) << 31), op, ": too many rows");
  // Chunks of kRowsPerChunk rows, larger when there would be more than a grid's 65535.
  const int64_t rows_per_chunk = std::max<int64_t>(kRowsPerChunk, (n + 65534) / 65535);
  const int64_t chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
  Tensor pw = Tensor::empty({chunks, h}, DType::F32, x.device());
  Tensor pb = k.has_bias ? Tensor::empty({chunks, h}, DType::F32, x.device()) : Tensor();
  float* pbp = pb.defined() ? pb.data<float>() : nullptr;
  const unsigned col_blocks = unsigned((h + kThreads - 1) / kThreads);
  detail::with_kind<ops::kNormOpCount>(op, kind, x.device(), [&]<NormId K>() {
    // The weight partials first: dx may alias dout.
    norm_dwb_partial_kernel<K><<<dim3(col_blocks, unsigned(chunks)), kThreads, 0, stream()>>>(
        pw.data<float>(), pbp, a, rows_per_chunk);
    MG_CUDA_LAUNCH_CHECK();
    norm_dx_kernel<K><<<unsigned(n), kThreads, 0, stream()>>>(a);
  });
  MG_CUDA_LAUNCH_CHECK();
  norm_dwb_final_kernel<<<col_blocks, kThreads, 0, stream()>>>(a.dw, a.db, pw.data<float>(), pbp,
                                                               chunks, h);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
