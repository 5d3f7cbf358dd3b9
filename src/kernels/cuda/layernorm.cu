// LayerNorm over the last dimension (fp32): one block per row forward and backward; the weight and
// bias gradients are reduced in two deterministic passes (per-chunk partial sums, then the
// partials summed in chunk order).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::require_f32;
using detail::stream;

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerChunk = 64;

__global__ void layernorm_fwd_kernel(float* out, float* mean_out, float* rstd_out, const float* x,
                                     const float* w, const float* b, int64_t h, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * h;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += xr[j];
  const float mean = detail::block_sum(s, shared) / float(h);
  float v = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float d = xr[j] - mean;
    v += d * d;
  }
  const float var = detail::block_sum(v, shared) / float(h);
  const float rstd = rsqrtf(var + eps);
  float* orow = out + row * h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) orow[j] = (xr[j] - mean) * rstd * w[j] + b[j];
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

__global__ void layernorm_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                    const float* mean, const float* rstd, int64_t h,
                                    bool accumulate) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * h;
  const float* gr = dout + row * h;
  const float mu = mean[row], rs = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float g = gr[j] * w[j];
    const float xh = (xr[j] - mu) * rs;
    sg += g;
    sgx += g * xh;
  }
  const float mg = detail::block_sum(sg, shared) / float(h);
  const float mgx = detail::block_sum(sgx, shared) / float(h);
  float* dr = dx + row * h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float xh = (xr[j] - mu) * rs;
    const float v = rs * (gr[j] * w[j] - mg - xh * mgx);
    dr[j] = accumulate ? dr[j] + v : v;
  }
}

// partial[chunk, j] = sums over the chunk's rows (in row order) of dout*xhat (first h) and dout.
__global__ void layernorm_dwb_partial_kernel(float* partial_w, float* partial_b, const float* dout,
                                             const float* x, const float* mean, const float* rstd,
                                             int64_t n, int64_t h) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= h) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = min(n, r0 + kRowsPerChunk);
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = dout[r * h + j];
    sw += g * (x[r * h + j] - mean[r]) * rstd[r];
    sb += g;
  }
  partial_w[chunk * h + j] = sw;
  partial_b[chunk * h + j] = sb;
}

__global__ void layernorm_dwb_final_kernel(float* dw, float* db, const float* partial_w,
                                           const float* partial_b, int64_t chunks, int64_t h) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= h) return;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += partial_w[c * h + j];
    sb += partial_b[c * h + j];
  }
  dw[j] += sw;
  db[j] += sb;
}

}  // namespace

void layernorm_fwd(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                   const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "cuda::layernorm_fwd";
  for (auto [n, t] : {std::pair{"out", &out}, {"mean", &mean}, {"rstd", &rstd}, {"x", &x},
                      {"weight", &weight}, {"bias", &bias}})
    require_f32(op, n, *t);
  const int64_t h = x.size(-1), rows = x.numel() / h;
  MG_CHECK(weight.numel() == h && bias.numel() == h && mean.numel() == rows &&
               rstd.numel() == rows && out.numel() == x.numel(),
           op, ": inconsistent sizes");
  if (rows == 0) return;
  layernorm_fwd_kernel<<<unsigned(rows), kThreads, 0, stream()>>>(
      out.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(),
      weight.data<float>(), bias.data<float>(), h, eps);
  MG_CUDA_LAUNCH_CHECK();
}

void layernorm_bwd(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                   const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                   const Tensor& rstd, bool accumulate_dx) {
  const char* op = "cuda::layernorm_bwd";
  for (auto [n, t] : {std::pair{"dx", &dx}, {"dweight", &dweight}, {"dbias", &dbias},
                      {"dout", &dout}, {"x", &x}, {"weight", &weight}, {"mean", &mean},
                      {"rstd", &rstd}})
    require_f32(op, n, *t);
  const int64_t h = x.size(-1), rows = x.numel() / h;
  MG_CHECK(dx.numel() == x.numel() && dout.numel() == x.numel() && weight.numel() == h &&
               dweight.numel() == h && dbias.numel() == h && mean.numel() == rows &&
               rstd.numel() == rows,
           op, ": inconsistent sizes");
  if (rows == 0) return;
  layernorm_dx_kernel<<<unsigned(rows), kThreads, 0, stream()>>>(
      dx.data<float>(), dout.data<float>(), x.data<float>(), weight.data<float>(),
      mean.data<float>(), rstd.data<float>(), h, accumulate_dx);
  MG_CUDA_LAUNCH_CHECK();
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  Tensor pw = Tensor::empty({chunks, h}, DType::F32, x.device());
  Tensor pb = Tensor::empty({chunks, h}, DType::F32, x.device());
  const dim3 grid(unsigned((h + kThreads - 1) / kThreads), unsigned(chunks));
  layernorm_dwb_partial_kernel<<<grid, kThreads, 0, stream()>>>(
      pw.data<float>(), pb.data<float>(), dout.data<float>(), x.data<float>(), mean.data<float>(),
      rstd.data<float>(), rows, h);
  MG_CUDA_LAUNCH_CHECK();
  layernorm_dwb_final_kernel<<<unsigned((h + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
      dweight.data<float>(), dbias.data<float>(), pw.data<float>(), pb.data<float>(), chunks, h);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
