// Internal helpers shared by the CUDA kernel files: error checks, the backend stream, argument
// checks and launch geometry.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

#define MG_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t mg_err_ = (expr);                                                             \
    if (mg_err_ != cudaSuccess)                                                               \
      MG_THROW("CUDA error in ", #expr, " (", __FILE__, ":", __LINE__, "): ",                 \
               cudaGetErrorString(mg_err_));                                                  \
  } while (0)

// Checks the launch that just happened (configuration errors surface here; execution errors at
// the next synchronisation).
#define MG_CUDA_LAUNCH_CHECK() MG_CUDA_CHECK(cudaGetLastError())

namespace megatron::cuda::detail {

cudaStream_t stream();  // the backend's stream (created by init)

inline void require_cuda(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(t.defined(), op, ": ", name, " is undefined");
  MG_REQUIRE(t.device().is_cuda(), op, ": ", name, " is on ", t.device().to_string(),
             ", expected a CUDA tensor");
  MG_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

inline void require_f32(const char* op, const char* name, const Tensor& t) {
  require_cuda(op, name, t);
  MG_CHECK(t.dtype() == DType::F32, op, ": ", name, " must be fp32, got ", dtype_name(t.dtype()));
}

inline void require_same_numel(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.numel() == b.numel(), op, ": element counts differ (", a.numel(), " vs ", b.numel(),
           ")");
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return unsigned(blocks);
}

// Block-wide sum of a float (any block size that is a multiple of 32, at most 1024). Every
// thread gets the result.
__device__ inline float block_sum(float v, float* shared32) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = lane < nwarps ? shared32[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float block_max(float v, float* shared32) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = lane < nwarps ? shared32[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace megatron::cuda::detail
