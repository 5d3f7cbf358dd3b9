// Embedding lookups and their deterministic backward: token positions are sorted by id (a stable
// radix sort, so equal ids keep token order), then each run of equal ids is summed by one block in
// token order — the same order as the CPU op, with no atomics. The plain lookup rejects ids
// outside the table with an Error, as the CPU does (one small copy back); the vocabulary-parallel
// one gives zero rows for ids another rank owns.
#include <cub/cub.cuh>

#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::require_f32;
using detail::stream;

namespace {

constexpr int kThreads = 256;

// out row i = weight row ids[i] - start, or zeros when that is outside [0, V).
template <typename W>
__global__ void embedding_fwd_kernel(float* out, const int32_t* ids, const W* w, int64_t start,
                                     int64_t V, int64_t h) {
  const int64_t i = blockIdx.x;
  const int64_t id = int64_t(ids[i]) - start;
  float* o = out + i * h;
  const bool ok = id >= 0 && id < V;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    o[j] = ok ? detail::load_f(w, id * h + j) : 0.0f;
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = int32_t(i);
}

// Block `start` sums the run of equal sorted ids beginning there (the others return at once).
__global__ void embedding_bwd_kernel(float* dw, const int32_t* sorted_ids, const int32_t* order,
                                     const float* dout, int64_t n, int64_t vocab_start, int64_t V,
                                     int64_t h) {
  const int64_t start = blockIdx.x;
  const int32_t id = sorted_ids[start];
  if (start > 0 && sorted_ids[start - 1] == id) return;  // not the first of its run
  const int64_t row = int64_t(id) - vocab_start;
  if (row < 0 || row >= V) return;  // another rank's id
  int64_t end = start + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  float* r = dw + row * h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float s = r[j];
    for (int64_t k = start; k < end; ++k) s += dout[int64_t(order[k]) * h + j];
    r[j] = s;
  }
}

void require_ids(const char* op, const Tensor& ids) {
  detail::require_cuda(op, "ids", ids);
  MG_CHECK(ids.dtype() == DType::I32, op, ": ids must be contiguous int32");
  MG_CHECK(ids.numel() < (int64_t(1) << 31), op, ": too many tokens");
}

void lookup(const char* op, const Tensor& out, const Tensor& ids, const Tensor& weight,
            int64_t start) {
  require_f32(op, "out", out);
  detail::require_cuda(op, "weight", weight);
  require_ids(op, ids);
  MG_CHECK(weight.dim() == 2, op, ": weight must be [rows, h]");
  const int64_t n = ids.numel(), V = weight.size(0), h = weight.size(1);
  MG_CHECK(out.numel() == n * h, op, ": out has ", out.numel(), " elements, want ", n * h);
  if (n == 0) return;
  detail::with_float_type(op, weight.dtype(), [&](auto tag) {
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    embedding_fwd_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
        out.data<float>(), ids.data<int32_t>(), static_cast<const W*>(weight.raw_data()), start, V,
        h);
  });
  MG_CUDA_LAUNCH_CHECK();
}

// dweight rows [start, start + V) += the rows of dout of the tokens with those ids.
void scatter_add(const char* op, const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                 int64_t vocab_start) {
  require_f32(op, "dweight", dweight);
  require_f32(op, "dout", dout);
  require_ids(op, ids);
  MG_CHECK(dweight.dim() == 2, op, ": dweight must be [rows, h]");
  const int64_t n = ids.numel(), V = dweight.size(0), h = dweight.size(1);
  MG_CHECK(dout.numel() == n * h, op, ": dout has ", dout.numel(), " elements, want ", n * h);
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
      dout.data<float>(), n, vocab_start, V, h);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace

void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight) {
  const char* op = "embedding_fwd";
  require_ids(op, ids);
  MG_CHECK(weight.dim() == 2, op, ": weight must be [V, h]");
  const detail::BadId bad = detail::first_id_outside(ids, 0, weight.size(0));
  MG_REQUIRE(bad.position < 0, "embedding index ", bad.value, " at position ", bad.position,
             " is outside the table [0, ", weight.size(0), ")");
  lookup(op, out, ids, weight, 0);
}

void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout) {
  const char* op = "embedding_bwd";
  require_ids(op, ids);
  MG_CHECK(dweight.dim() == 2, op, ": dweight must be [V, h]");
  MG_CHECK(detail::first_id_outside(ids, 0, dweight.size(0)).position < 0, op,
           ": id out of range");
  scatter_add(op, dweight, ids, dout, 0);
}

void vocab_parallel_embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight,
                                  int64_t vocab_start) {
  lookup("vocab_parallel_embedding_fwd", out, ids, weight, vocab_start);
}

void vocab_parallel_embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                                  int64_t vocab_start) {
  scatter_add("vocab_parallel_embedding_bwd", dweight, ids, dout, vocab_start);
}

}  // namespace megatron::cuda
