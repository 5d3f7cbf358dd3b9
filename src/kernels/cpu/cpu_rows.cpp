// Row gather / scatter, flat-buffer packing and double-precision sums on the CPU. Gathers and
// copies move bytes (any dtype); sums (sum, dot, l2_norm_squared) read any float dtype. Sums run
// in fixed blocks whose partial sums are added in order, so they do not depend on the thread
// count. int_range gives the
// extremes of int32 ids.
#include <omp.h>

#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {
namespace {

// A 2-D operand with unit inner stride seen as rows of bytes.
struct Rows {
  char* p;
  int64_t rows, width, ld;  // ld and width in elements
  size_t el;
  const char* end() const { return p + (rows == 0 ? 0 : size_t((rows - 1) * ld + width) * el); }
};

Rows as_rows(const char* op, const char* name, const Tensor& t) {
  cpu::require_host(op, t);
  MG_CHECK(t.defined(), op, ": ", name, " is undefined");
  MG_CHECK(t.dim() == 2, op, ": ", name, " must be 2-D [rows, width], got ", shape_str(t.shape()));
  MG_CHECK(t.stride(1) == 1 || t.size(1) <= 1, op, ": ", name, " needs unit inner stride");
  const int64_t ld = t.size(0) <= 1 ? t.size(1) : t.stride(0);
  MG_CHECK(ld >= t.size(1), op, ": ", name, " rows overlap (row stride ", ld, ")");
  return {static_cast<char*>(t.raw_data()), t.size(0), t.size(1), ld, dtype_size(t.dtype())};
}

const int32_t* check_index(const char* op, const Tensor& index, int64_t k, int64_t n) {
  cpu::require_host(op, index);
  MG_CHECK(index.defined() && index.dtype() == DType::I32 && index.is_contiguous(), op,
           ": index must be contiguous int32");
  MG_CHECK(index.numel() == k, op, ": index has ", index.numel(), " entries for ", k, " rows");
  const int32_t* ix = index.data<int32_t>();
  for (int64_t i = 0; i < k; ++i)
    MG_CHECK(ix[i] >= 0 && ix[i] < n, op, ": index[", i, "] = ", ix[i], " is outside the ", n,
             " rows [0, ", n, ")");
  return ix;
}

void check_pair(const char* op, const Tensor& out, const Tensor& in, const Rows& o, const Rows& i) {
  MG_CHECK(out.dtype() == in.dtype(), op, ": out is ", dtype_name(out.dtype()), ", in is ",
           dtype_name(in.dtype()));
  MG_CHECK(o.width == i.width, op, ": out rows have ", o.width, " elements, in rows ", i.width);
  MG_CHECK(o.end() <= i.p || i.end() <= o.p, op, ": out overlaps in");
}

}  // namespace

void index_select_rows(const Tensor& out, const Tensor& in, const Tensor& index) {
  const char* op = "index_select_rows";
  const Rows o = as_rows(op, "out", out), s = as_rows(op, "in", in);
  check_pair(op, out, in, o, s);
  const int32_t* ix = check_index(op, index, o.rows, s.rows);
  const size_t bytes = size_t(o.width) * o.el;
  cpu::parallel_for(o.rows, o.rows * o.width, [&](int64_t i) {
    std::memcpy(o.p + size_t(i * o.ld) * o.el, s.p + size_t(int64_t(ix[i]) * s.ld) * s.el, bytes);
  });
}

void index_copy_rows(const Tensor& out, const Tensor& in, const Tensor& index, bool accumulate) {
  const char* op = "index_copy_rows";
  const Rows o = as_rows(op, "out", out), s = as_rows(op, "in", in);
  check_pair(op, out, in, o, s);
  const int32_t* ix = check_index(op, index, s.rows, o.rows);
  if (accumulate) {
    MG_CHECK(out.dtype() == DType::F32, op, ": accumulate needs float32, got ",
             dtype_name(out.dtype()));
    float* d = reinterpret_cast<float*>(o.p);
    const float* x = reinterpret_cast<const float*>(s.p);
    // Each thread owns a column block and walks the rows in index order: duplicates are summed
    // in a fixed order whatever the thread count.
    auto columns = [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < s.rows; ++i) {
        float* drow = d + int64_t(ix[i]) * o.ld;
        const float* xrow = x + i * s.ld;
        for (int64_t c = c0; c < c1; ++c) drow[c] += xrow[c];
      }
    };
    if (s.rows * s.width <= kMinParallelWork) {
      columns(0, s.width);
      return;
    }
#pragma omp parallel
    {
      const int T = omp_get_num_threads(), t = omp_get_thread_num();
      columns(s.width * t / T, s.width * (t + 1) / T);
    }
    return;
  }
  std::vector<char> seen(size_t(o.rows), 0);
  for (int64_t i = 0; i < s.rows; ++i) {
    MG_CHECK(!seen[size_t(ix[i])], op, ": index[", i, "] = ", ix[i],
             " repeats an earlier index (only accumulate may write a row twice)");
    seen[size_t(ix[i])] = 1;
  }
  const size_t bytes = size_t(o.width) * o.el;
  cpu::parallel_for(s.rows, s.rows * s.width, [&](int64_t i) {
    std::memcpy(o.p + size_t(int64_t(ix[i]) * o.ld) * o.el, s.p + size_t(i * s.ld) * s.el, bytes);
  });
}

namespace {
// Checks flat against parts and calls f(part_bytes, flat_bytes, nbytes) for each part.
template <class F>
void for_each_part(const char* op, const Tensor& flat, const std::vector<Tensor>& parts, F&& f) {
  cpu::require_host(op, flat);
  MG_CHECK(flat.defined() && flat.is_contiguous(), op, ": flat must be contiguous");
  int64_t total = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const Tensor& p = parts[k];
    cpu::require_host(op, p);
    MG_CHECK(p.defined() && p.is_contiguous() && p.dtype() == flat.dtype(), op, ": parts[", k,
             "] must be contiguous ", dtype_name(flat.dtype()), " like flat");
    total += p.numel();
  }
  MG_CHECK(total == flat.numel(), op, ": parts hold ", total, " elements, flat ", flat.numel());
  char* fp = static_cast<char*>(flat.raw_data());
  size_t at = 0;
  for (const Tensor& p : parts) {
    f(static_cast<char*>(p.raw_data()), fp + at, p.nbytes());
    at += p.nbytes();
  }
}
}  // namespace

void copy_to_flat(const Tensor& flat, const std::vector<Tensor>& parts) {
  for_each_part("copy_to_flat", flat, parts,
                [](char* part, char* f, size_t n) { std::memcpy(f, part, n); });
}

void copy_from_flat(const std::vector<Tensor>& parts, const Tensor& flat) {
  for_each_part("copy_from_flat", flat, parts,
                [](char* part, char* f, size_t n) { std::memcpy(part, f, n); });
}

namespace {
constexpr int64_t kSumBlock = 4096;

inline double to_f64(double v) { return v; }
template <class T>
inline double to_f64(T v) {
  return double(to_f32(v));
}

// f(p) with p the typed data of a contiguous float tensor (fp32, fp64, bf16 or fp16).
template <class F>
auto with_data(const char* op, const Tensor& x, F&& f) {
  cpu::require_host(op, x);
  MG_CHECK(x.defined() && x.is_contiguous(), op, ": tensor must be contiguous");
  switch (x.dtype()) {
    case DType::F32: return f(x.data<float>());
    case DType::F64: return f(x.data<double>());
    case DType::BF16: return f(x.data<bf16>());
    case DType::F16: return f(x.data<fp16>());
    default: break;
  }
  MG_CHECK(false, op, ": not a float dtype: ", dtype_name(x.dtype()));
  return f(static_cast<const float*>(nullptr));  // not reached
}

// Sum over i < n of term(a[i], b[i]) (values as double; b may be a's pointer), in blocks of
// kSumBlock summed in order; within a block in the vector order of the simd loop, fixed for a
// build whatever the thread count. `term` is stateless and the pointers are the loop's own
// locals, so the loop is plain vector loads (captured references made GCC gather every lane).
template <class A, class B, class Term>
double blocked_sum(int64_t n, const A* a, const B* b, Term term) {
  const int64_t nb = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> part(size_t(nb), 0.0);
  double* out = part.data();
  parallel_for(nb, n, [a, b, n, out, term](int64_t blk) {
    const A* pa = a;
    const B* pb = b;
    double s = 0;
    const int64_t e = std::min(n, (blk + 1) * kSumBlock);
#pragma omp simd reduction(+ : s)
    for (int64_t i = blk * kSumBlock; i < e; ++i) s += term(to_f64(pa[i]), to_f64(pb[i]));
    out[blk] = s;
  });
  double total = 0;
  for (double v : part) total += v;
  return total;
}
}  // namespace

double sum(const Tensor& x) {
  return with_data("sum", x, [&](const auto* p) {
    return blocked_sum(x.numel(), p, p, [](double v, double) { return v; });
  });
}

double l2_norm_squared(const Tensor& x) {
  return with_data("l2_norm_squared", x, [&](const auto* p) {
    return blocked_sum(x.numel(), p, p, [](double v, double) { return v * v; });
  });
}

std::vector<double> l2_norm_squared_each(const std::vector<Tensor>& xs) {
  std::vector<double> out;
  out.reserve(xs.size());
  for (const Tensor& x : xs) out.push_back(l2_norm_squared(x));
  return out;
}

double dot(const Tensor& a, const Tensor& b) {
  cpu::require_numel("dot", a, b);
  return with_data("dot", a, [&](const auto* pa) {
    return with_data("dot", b, [&](const auto* pb) {
      return blocked_sum(a.numel(), pa, pb, [](double x, double y) { return x * y; });
    });
  });
}

IntRange int_range(const Tensor& ids) {
  cpu::require_host("int_range", ids);
  MG_CHECK(ids.defined() && ids.is_contiguous() && ids.dtype() == DType::I32,
           "int_range: ids must be a contiguous int32 tensor");
  const int32_t* p = ids.data<int32_t>();
  const int64_t n = ids.numel();
  int32_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
#pragma omp parallel for simd reduction(min : lo) reduction(max : hi) if (n >= 4 * kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  if (n == 0) return {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  return {lo, hi};
}

}  // namespace megatron::ops::cpu
