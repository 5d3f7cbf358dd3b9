// Reductions over one tensor on the GPU: sum, dot and the squared L2 norm in double (any float
// dtype), the finite check, the int32 id range, and the out-of-range id search the id-taking ops
// use. Sums run in fixed blocks of kSumBlock elements whose double partial sums are added in a
// fixed order, so a result does not depend on scheduling (the CPU uses the same blocks). Each
// returns a host value: one small copy back, a synchronisation.
#include <climits>
#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kSumBlock = 4096;
constexpr int kFinalThreads = 1024;

template <typename T>
__device__ inline double load_d(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, double>) return p[i];
  else return double(detail::load_f<T>(p, i));
}

enum class SumKind { sum, dot, squares };

// partial[b] = the sum over block b's elements of term(i), reduced in a fixed tree.
template <SumKind K, typename A, typename B>
__global__ void block_sums_kernel(const A* a, const B* b, int64_t n, double* partial) {
  __shared__ double shared[kThreads];
  const int64_t start = int64_t(blockIdx.x) * kSumBlock;
  const int64_t end = min(n, start + kSumBlock);
  double s = 0.0;
  for (int64_t i = start + threadIdx.x; i < end; i += kThreads) {
    const double x = load_d(a, i);
    if constexpr (K == SumKind::sum) s += x;
    if constexpr (K == SumKind::squares) s += x * x;
    if constexpr (K == SumKind::dot) s += x * load_d(b, i);
  }
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) shared[threadIdx.x] += shared[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

// out[0] = the sum of partial[0, n): each thread a contiguous run in order, then a fixed tree.
__global__ void final_sum_kernel(const double* partial, int64_t n, double* out) {
  __shared__ double shared[kFinalThreads];
  const int64_t per = (n + kFinalThreads - 1) / kFinalThreads;
  const int64_t lo = min(n, int64_t(threadIdx.x) * per), hi = min(n, lo + per);
  double s = 0.0;
  for (int64_t i = lo; i < hi; ++i) s += partial[i];
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) shared[threadIdx.x] += shared[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = shared[0];
}

double host_double(const Tensor& t) { return t.to(Device::cpu()).data<double>()[0]; }

template <SumKind K>
double blocked_sum(const char* op, const Tensor& a, const Tensor& b) {
  detail::require_cuda(op, "x", a);
  if (K == SumKind::dot) {
    detail::require_cuda(op, "b", b);
    detail::require_same_numel(op, a, b);
  }
  const int64_t n = a.numel();
  if (n == 0) return 0.0;
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  MG_CHECK(blocks < (int64_t(1) << 31), op, ": ", n, " elements are too many for one sum");
  Tensor partial = Tensor::empty({blocks}, DType::F64, a.device());
  Tensor total = Tensor::empty({1}, DType::F64, a.device());
  detail::with_float_type(op, a.dtype(), [&](auto a_tag) {
    using TA = std::remove_cv_t<std::remove_pointer_t<decltype(a_tag)>>;
    const TA* ap = static_cast<const TA*>(a.raw_data());
    if constexpr (K == SumKind::dot) {
      detail::with_float_type(op, b.dtype(), [&](auto b_tag) {
        using TB = std::remove_cv_t<std::remove_pointer_t<decltype(b_tag)>>;
        block_sums_kernel<K, TA, TB><<<unsigned(blocks), kThreads, 0, stream()>>>(
            ap, static_cast<const TB*>(b.raw_data()), n, partial.data<double>());
      }, true);
    } else {
      block_sums_kernel<K, TA, float><<<unsigned(blocks), kThreads, 0, stream()>>>(
          ap, nullptr, n, partial.data<double>());
    }
  }, true);
  MG_CUDA_LAUNCH_CHECK();
  final_sum_kernel<<<1, kFinalThreads, 0, stream()>>>(partial.data<double>(), blocks,
                                                       total.data<double>());
  MG_CUDA_LAUNCH_CHECK();
  return host_double(total);
}

template <typename T>
__global__ void nonfinite_kernel(const T* x, int64_t n, int* flag) {
  bool bad = false;
  MG_GRID_STRIDE(i, n) bad |= !isfinite(load_d(x, i));
  if (bad) *flag = 1;
}

__global__ void int_range_kernel(const int32_t* ids, int64_t n, int* lo_hi) {
  int lo = INT_MAX, hi = INT_MIN;
  MG_GRID_STRIDE(i, n) {
    lo = min(lo, ids[i]);
    hi = max(hi, ids[i]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMin(lo_hi, lo);
    atomicMax(lo_hi + 1, hi);
  }
}

template <typename I>
__global__ void first_outside_kernel(const I* ids, int64_t n, int64_t lo, int64_t hi,
                                     unsigned long long* first) {
  MG_GRID_STRIDE(i, n) {
    const int64_t v = int64_t(ids[i]);
    if (v < lo || v >= hi) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace

namespace detail {

BadId first_id_outside(const Tensor& ids, int64_t lo, int64_t hi) {
  const char* op = "id range check";
  require_cuda(op, "ids", ids);
  MG_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, op,
           ": ids must be int32 or int64, got ", dtype_name(ids.dtype()));
  const int64_t n = ids.numel();
  if (n == 0) return {};
  Tensor first = Tensor::from_vector<int64_t>({INT64_MAX}, {1}, ids.device());
  auto* f = reinterpret_cast<unsigned long long*>(first.data<int64_t>());
  if (ids.dtype() == DType::I32)
    first_outside_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ids.data<int32_t>(), n, lo, hi, f);
  else
    first_outside_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ids.data<int64_t>(), n, lo, hi, f);
  MG_CUDA_LAUNCH_CHECK();
  const int64_t at = first.to(Device::cpu()).data<int64_t>()[0];
  if (at == INT64_MAX) return {};
  return {at, int64_t(ids.item_as_double(at))};
}

}  // namespace detail

double sum(const Tensor& x) { return blocked_sum<SumKind::sum>("cuda::sum", x, Tensor()); }

double dot(const Tensor& a, const Tensor& b) { return blocked_sum<SumKind::dot>("cuda::dot", a, b); }

double l2_norm_squared(const Tensor& x) {
  return blocked_sum<SumKind::squares>("cuda::l2_norm_squared", x, Tensor());
}

bool all_finite(const Tensor& x) {
  const char* op = "cuda::all_finite";
  detail::require_cuda(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return true;
  Tensor flag = Tensor::zeros({1}, DType::I32, x.device());
  detail::with_float_type(op, x.dtype(), [&](auto tag) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    nonfinite_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream()>>>(
        static_cast<const T*>(x.raw_data()), n, flag.data<int>());
  }, true);
  MG_CUDA_LAUNCH_CHECK();
  return flag.to(Device::cpu()).data<int>()[0] == 0;
}

ops::IntRange int_range(const Tensor& ids) {
  const char* op = "cuda::int_range";
  detail::require_cuda(op, "ids", ids);
  MG_CHECK(ids.dtype() == DType::I32, op, ": ids must be a contiguous int32 tensor");
  const int64_t n = ids.numel();
  if (n == 0) return {INT64_MAX, INT64_MIN};
  Tensor lo_hi = Tensor::from_vector<int32_t>({INT_MAX, INT_MIN}, {2}, ids.device());
  int_range_kernel<<<detail::grid_for(n, kThreads, 1024), kThreads, 0, stream()>>>(
      ids.data<int32_t>(), n, lo_hi.data<int32_t>());
  MG_CUDA_LAUNCH_CHECK();
  const Tensor h = lo_hi.to(Device::cpu());
  return {h.data<int32_t>()[0], h.data<int32_t>()[1]};
}

}  // namespace megatron::cuda
