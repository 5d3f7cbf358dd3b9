// Embedding lookup and its deterministic backward: token positions are sorted by id (a stable
// radix sort, so equal ids keep token order), then each run of equal ids is summed by one block in
// token order — the same order as the CPU op, with no atomics. Ids outside [0, V) give zero rows
// forward and no gradient (ids are validated against the vocabulary when data is loaded).
#include <cub/cub.cuh>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::require_f32;
using detail::stream;

namespace {

constexpr int kThreads = 256;

__global__ void embedding_fwd_kernel(float* out, const int32_t* ids, const float* w, int64_t V,
                                     int64_t h) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  float* o = out + i * h;
  const bool ok = id >= 0 && id < V;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) o[j] = ok ? w[int64_t(id) * h + j] : 0.0f;
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = int32_t(i);
}

__global__ void embedding_bwd_kernel(float* dw, const int32_t* sorted_ids, const int32_t* order,
                                     const float* dout, int64_t n, int64_t V, int64_t h) {
  const int64_t start = blockIdx.x;
  const int32_t id = sorted_ids[start];
  if (start > 0 && sorted_ids[start - 1] == id) return;  // not the first of its run
  if (id < 0 || id >= V) return;
  int64_t end = start + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  float* row = dw + int64_t(id) * h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float s = row[j];
    for (int64_t k = start; k < end; ++k) s += dout[int64_t(order[k]) * h + j];
    row[j] = s;
  }
}

void require_ids(const char* op, const Tensor& ids) {
  detail::require_cuda(op, "ids", ids);
  MG_CHECK(ids.dtype() == DType::I32, op, ": ids must be int32");
  MG_CHECK(ids.numel() < (int64_t(1) << 31), op, ": too many tokens");
}

}  // namespace

void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight) {
  const char* op = "cuda::embedding_fwd";
  require_f32(op, "out", out);
  require_f32(op, "weight", weight);
  require_ids(op, ids);
  const int64_t n = ids.numel(), V = weight.size(0), h = weight.size(1);
  MG_CHECK(out.numel() == n * h, op, ": out size");
  if (n == 0) return;
  embedding_fwd_kernel<<<unsigned(n), kThreads, 0, stream()>>>(out.data<float>(), ids.data<int32_t>(),
                                                               weight.data<float>(), V, h);
  MG_CUDA_LAUNCH_CHECK();
}

void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout) {
  const char* op = "cuda::embedding_bwd";
  require_f32(op, "dweight", dweight);
  require_f32(op, "dout", dout);
  require_ids(op, ids);
  const int64_t n = ids.numel(), V = dweight.size(0), h = dweight.size(1);
  MG_CHECK(dout.numel() == n * h, op, ": dout size");
  if (n == 0) return;
  const Device dev = ids.device();
  Tensor order_in = Tensor::empty({n}, DType::I32, dev);
  Tensor order_out = Tensor::empty({n}, DType::I32, dev);
  Tensor sorted_ids = Tensor::empty({n}, DType::I32, dev);
  iota_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
      order_in.data<int32_t>(), n);
  MG_CUDA_LAUNCH_CHECK();
  size_t temp_bytes = 0;
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids.data<int32_t>(),
                                                sorted_ids.data<int32_t>(), order_in.data<int32_t>(),
                                                order_out.data<int32_t>(), int(n), 0, 32, stream()));
  Tensor temp = Tensor::empty({int64_t(temp_bytes) + 1}, DType::U8, dev);
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, ids.data<int32_t>(),
                                                sorted_ids.data<int32_t>(), order_in.data<int32_t>(),
                                                order_out.data<int32_t>(), int(n), 0, 32, stream()));
  embedding_bwd_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
      dweight.data<float>(), sorted_ids.data<int32_t>(), order_out.data<int32_t>(),
      dout.data<float>(), n, V, h);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
