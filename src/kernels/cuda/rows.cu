// Row gather / scatter (any dtype, moved as words of the element size) and flat-buffer packing on
// the GPU, with the CPU kernels' checks. The index is read back to the host for its checks (in
// range; distinct unless accumulating): one small copy, a synchronisation. Accumulating scatters
// give each column to one thread, which walks the index in order, so duplicates are summed in
// index order as on the CPU.
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;

namespace {

constexpr int kThreads = 256;

// A 2-D operand with unit inner stride.
struct Rows {
  char* p;
  int64_t rows, width, ld;  // ld and width in elements
  size_t el;
  const char* end() const { return p + (rows == 0 ? 0 : size_t((rows - 1) * ld + width) * el); }
};

Rows as_rows(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(t.defined(), op, ": ", name, " is undefined");
  MG_REQUIRE(t.device().is_cuda(), op, ": ", name, " is on ", t.device().to_string(),
             ", expected a CUDA tensor");
  MG_CHECK(t.dim() == 2, op, ": ", name, " must be 2-D [rows, width], got ", shape_str(t.shape()));
  MG_CHECK(t.stride(1) == 1 || t.size(1) <= 1, op, ": ", name, " needs unit inner stride");
  const int64_t ld = t.size(0) <= 1 ? t.size(1) : t.stride(0);
  MG_CHECK(ld >= t.size(1), op, ": ", name, " rows overlap (row stride ", ld, ")");
  return {static_cast<char*>(t.raw_data()), t.size(0), t.size(1), ld, dtype_size(t.dtype())};
}

void check_pair(const char* op, const Tensor& out, const Tensor& in, const Rows& o, const Rows& i) {
  MG_CHECK(out.dtype() == in.dtype(), op, ": out is ", dtype_name(out.dtype()), ", in is ",
           dtype_name(in.dtype()));
  MG_CHECK(o.width == i.width, op, ": out rows have ", o.width, " elements, in rows ", i.width);
  MG_CHECK(o.end() <= i.p || i.end() <= o.p, op, ": out overlaps in");
}

// The index on the host, checked: k entries in [0, n), distinct when `distinct`.
std::vector<int32_t> checked_index(const char* op, const Tensor& index, int64_t k, int64_t n,
                                   bool distinct) {
  detail::require_cuda(op, "index", index);
  MG_CHECK(index.dtype() == DType::I32, op, ": index must be contiguous int32");
  MG_CHECK(index.numel() == k, op, ": index has ", index.numel(), " entries for ", k, " rows");
  std::vector<int32_t> ix(static_cast<size_t>(k));
  if (k == 0) return ix;
  const Tensor h = index.to(Device::cpu());
  std::memcpy(ix.data(), h.raw_data(), size_t(k) * sizeof(int32_t));
  for (int64_t i = 0; i < k; ++i)
    MG_CHECK(ix[size_t(i)] >= 0 && ix[size_t(i)] < n, op, ": index[", i, "] = ", ix[size_t(i)],
             " is outside the ", n, " rows [0, ", n, ")");
  if (distinct) {
    std::vector<char> seen(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < k; ++i) {
      MG_CHECK(!seen[size_t(ix[size_t(i)])], op, ": index[", i, "] = ", ix[size_t(i)],
               " repeats an earlier index (only accumulate may write a row twice)");
      seen[size_t(ix[size_t(i)])] = 1;
    }
  }
  return ix;
}

// out row (scatter ? index[r] : r) = in row (scatter ? r : index[r]) for r < k, words of type W.
template <typename W>
__global__ void move_rows_kernel(W* out, int64_t out_ld, const W* in, int64_t in_ld,
                                 const int32_t* index, int64_t k, int64_t w, bool scatter) {
  MG_GRID_STRIDE(e, k * w) {
    const int64_t r = e / w, c = e - r * w;
    const int64_t src = scatter ? r : int64_t(index[r]);
    const int64_t dst = scatter ? int64_t(index[r]) : r;
    out[dst * out_ld + c] = in[src * in_ld + c];
  }
}

__global__ void scatter_add_rows_kernel(float* out, int64_t out_ld, const float* in, int64_t in_ld,
                                        const int32_t* index, int64_t k, int64_t w) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= w) return;
  for (int64_t r = 0; r < k; ++r) out[int64_t(index[r]) * out_ld + c] += in[r * in_ld + c];
}

template <typename W>
void launch_move(const Rows& o, const Rows& s, const Tensor& index, int64_t k, bool scatter) {
  move_rows_kernel<W><<<detail::grid_for(k * o.width, kThreads), kThreads, 0, stream()>>>(
      reinterpret_cast<W*>(o.p), o.ld, reinterpret_cast<const W*>(s.p), s.ld,
      index.data<int32_t>(), k, o.width, scatter);
}

void move_rows(const char* op, const Rows& o, const Rows& s, const Tensor& index, int64_t k,
               bool scatter) {
  if (k == 0 || o.width == 0) return;
  switch (o.el) {
    case 1: launch_move<uint8_t>(o, s, index, k, scatter); break;
    case 2: launch_move<uint16_t>(o, s, index, k, scatter); break;
    case 4: launch_move<uint32_t>(o, s, index, k, scatter); break;
    case 8: launch_move<uint64_t>(o, s, index, k, scatter); break;
    default: MG_CHECK(false, op, ": element size ", o.el, " not supported");
  }
  MG_CUDA_LAUNCH_CHECK();
}

// Checks flat against parts and calls f(part_address, flat_address, bytes) for each part.
template <class F>
void for_each_part(const char* op, const Tensor& flat, const std::vector<Tensor>& parts, F&& f) {
  detail::require_cuda(op, "flat", flat);
  int64_t total = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const Tensor& p = parts[k];
    MG_CHECK(p.defined() && p.device() == flat.device() && p.is_contiguous() &&
                 p.dtype() == flat.dtype(),
             op, ": parts[", k, "] must be contiguous ", dtype_name(flat.dtype()), " like flat");
    total += p.numel();
  }
  MG_CHECK(total == flat.numel(), op, ": parts hold ", total, " elements, flat ", flat.numel());
  char* fp = static_cast<char*>(flat.raw_data());
  size_t at = 0;
  for (const Tensor& p : parts) {
    if (p.nbytes() > 0) f(static_cast<char*>(p.raw_data()), fp + at, p.nbytes());
    at += p.nbytes();
  }
}

}  // namespace

void index_select_rows(const Tensor& out, const Tensor& in, const Tensor& index) {
  const char* op = "index_select_rows";
  const Rows o = as_rows(op, "out", out), s = as_rows(op, "in", in);
  check_pair(op, out, in, o, s);
  checked_index(op, index, o.rows, s.rows, false);
  move_rows(op, o, s, index, o.rows, false);
}

void index_copy_rows(const Tensor& out, const Tensor& in, const Tensor& index, bool accumulate) {
  const char* op = "index_copy_rows";
  const Rows o = as_rows(op, "out", out), s = as_rows(op, "in", in);
  check_pair(op, out, in, o, s);
  checked_index(op, index, s.rows, o.rows, !accumulate);
  if (!accumulate) {
    move_rows(op, o, s, index, s.rows, true);
    return;
  }
  MG_CHECK(out.dtype() == DType::F32, op, ": accumulate needs float32, got ",
           dtype_name(out.dtype()));
  if (s.rows == 0 || s.width == 0) return;
  scatter_add_rows_kernel<<<detail::grid_for(s.width, kThreads), kThreads, 0, stream()>>>(
      reinterpret_cast<float*>(o.p), o.ld, reinterpret_cast<const float*>(s.p), s.ld,
      index.data<int32_t>(), s.rows, s.width);
  MG_CUDA_LAUNCH_CHECK();
}

void copy_to_flat(const Tensor& flat, const std::vector<Tensor>& parts) {
  for_each_part("copy_to_flat", flat, parts, [](char* part, char* f, size_t n) {
    MG_CUDA_CHECK(cudaMemcpyAsync(f, part, n, cudaMemcpyDeviceToDevice, stream()));
  });
}

void copy_from_flat(const std::vector<Tensor>& parts, const Tensor& flat) {
  for_each_part("copy_from_flat", flat, parts, [](char* part, char* f, size_t n) {
    MG_CUDA_CHECK(cudaMemcpyAsync(part, f, n, cudaMemcpyDeviceToDevice, stream()));
  });
}

}  // namespace megatron::cuda
