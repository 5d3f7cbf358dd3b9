// Internal helpers shared by the CUDA kernel files: error checks, the backend stream, argument
// checks, launch geometry, dtype loads and stores, block reductions and the id range check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

// for (i = this thread's first; i < n; i += all threads)
#define MG_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n);         \
       i += int64_t(gridDim.x) * blockDim.x)

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

// An fp32 CUDA tensor of n elements (when `required` or defined); its data, or nullptr.
template <class T>
T* f32_or_null(const char* op, const char* name, const Tensor& t, int64_t n, bool required) {
  if (!required && !t.defined()) return nullptr;
  require_f32(op, name, t);
  MG_CHECK(t.numel() == n, op, ": ", name, " has ", t.numel(), " elements, want ", n);
  return t.data<float>();
}

// A bf16 output of n elements written from fp32 values computed from x (norms, activations):
// contiguous, on the device, and not in x's storage (an fp32 output may alias x; a bf16 one would
// overwrite inputs not yet read).
inline void require_bf16_output(const char* op, const Tensor& out, const Tensor& x, int64_t n) {
  require_cuda(op, "out", out);
  MG_CHECK(out.numel() == n, op, ": out has ", out.numel(), " elements, want ", n);
  MG_CHECK(out.storage() != x.storage(), op, ": a bfloat16 out may not share x's storage");
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

// ---- dtype loads and stores (fp32 compute; RNE on the way back; fp64 through fp32) -------------
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
template <>
__device__ inline float load_f<double>(const double* p, int64_t i) { return float(p[i]); }

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
template <>
__device__ inline void store_f<double>(double* p, int64_t i, float v) { p[i] = double(v); }

// fn(static_cast<const T*>(nullptr)) with T the device type of a float dtype (fp32, bf16, fp16;
// fp64 too when with_f64); any other dtype throws naming the op.
template <class Fn>
decltype(auto) with_float_type(const char* op, DType dt, Fn&& fn, bool with_f64 = false) {
  switch (dt) {
    case DType::F32: return fn(static_cast<const float*>(nullptr));
    case DType::BF16: return fn(static_cast<const __nv_bfloat16*>(nullptr));
    case DType::F16: return fn(static_cast<const __half*>(nullptr));
    case DType::F64:
      if (with_f64) return fn(static_cast<const double*>(nullptr));
      break;
    default: break;
  }
  MG_CHECK(false, op, ": not a floating-point dtype this CUDA op takes: ", dtype_name(dt));
  return fn(static_cast<const float*>(nullptr));  // not reached
}

// ---- block reductions ----------------------------------------------------------------------
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

// ---- ids checked on the device ---------------------------------------------------------------
// The first position i (in element order) of a contiguous int32 or int64 tensor whose value lies
// outside [lo, hi), and that value; {-1, 0} when all are inside. One small copy to the host (a
// synchronisation): the ops whose CPU kernels reject bad ids with an Error do the same here.
struct BadId {
  int64_t position = -1, value = 0;
};
BadId first_id_outside(const Tensor& ids, int64_t lo, int64_t hi);

}  // namespace megatron::cuda::detail

#include <utility>

#include "kernels/backend.h"

namespace megatron::cuda::detail {

// The kernel of a kind (kernels/op_kinds.h) for the kind-taking ops, as the CPU backend's
// cpu::with_kind: calls fn.template operator()<Id(i)>() for the i of [0, Count) equal to `kind`.
// Every kind's kernel is instantiated, so a kind without a CUDA kernel does not compile; an id
// outside [0, Count) throws Error naming the op.
template <size_t Count, class Id, class Fn>
void with_kind(const char* op, Id kind, Device device, Fn&& fn) {
  const bool found = [&]<size_t... I>(std::index_sequence<I...>) {
    return ((size_t(kind) == I && (fn.template operator()<Id(I)>(), true)) || ...);
  }(std::make_index_sequence<Count>{});
  if (!found) ops::detail::throw_no_kind_kernel(op, kind, device);
}

}  // namespace megatron::cuda::detail
