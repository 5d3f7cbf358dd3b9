// Matrix-vector products (cpu_matmul.h's matvec): decoding one token multiplies every weight
// matrix by one vector, a pass over the matrix that memory speed bounds. y = M x reads each row
// of M once as a dot product with x; y = M^T x adds x[i] times row i of M into y (axpy), each
// thread owning a block of y's entries. fp32, bf16 and fp16 matrices are read as they are stored
// (half precision: half the bytes) and widened in registers.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_matmul.h"

namespace megatron::ops::cpu {
namespace {

// Output entries [j0, j1) of each of the `parts` blocks (multiples of 16 entries) on the OpenMP
// threads when the matrix is large enough to pay for a parallel region.
template <class Fn>
void split(int64_t outputs, double elements, Fn&& fn) {
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (nt == 1 || elements < double(kMinParallelWork) * 8 || outputs < 32) {
    fn(int64_t(0), outputs);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t j0 = (outputs * t / T) & ~int64_t(15);
    const int64_t j1 = t + 1 == T ? outputs : (outputs * (t + 1) / T) & ~int64_t(15);
    if (j1 > j0) fn(j0, j1);
  }
}

// The entries of x as fp32 in a contiguous buffer (exact widening).
template <class T>
const float* gather(const T* x, int64_t n, int64_t inc, std::vector<float>& buf) {
  buf.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = to_f32(x[i * inc]);
  return buf.data();
}

inline void store(float* y, float acc, float alpha, float beta) {
  *y = beta == 0.0f ? alpha * acc : alpha * acc + beta * *y;  // beta 0 ignores y (NaNs too)
}

// The vector loops take their pointers as arguments: read through a lambda's captured
// references, GCC vectorises them with a gather per lane.
template <class T>
float dot_row(const T* __restrict row, const float* __restrict x, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += to_f32(row[i]) * x[i];
  return acc;
}
template <class T>
void axpy_row(float* __restrict acc, const T* __restrict row, float xi, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) acc[j] += xi * to_f32(row[j]);
}

// y[j] = alpha dot(M row j, x) + beta y[j] for j < rows.
template <class T>
void dots(const T* M, int64_t rows, int64_t cols, int64_t ld, const float* x, float alpha,
          float beta, float* y, int64_t incy) {
  split(rows, double(rows) * double(cols), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      store(y + j * incy, dot_row(M + j * ld, x, cols), alpha, beta);
  });
}

// y[j] = alpha sum_i x[i] M[i, j] + beta y[j] for j < cols.
template <class T>
void axpys(const T* M, int64_t rows, int64_t cols, int64_t ld, const float* x, float alpha,
           float beta, float* y, int64_t incy) {
  split(cols, double(rows) * double(cols), [&](int64_t j0, int64_t j1) {
    constexpr int64_t kBlock = 1024;  // accumulators of one block stay in L1
    float acc[kBlock];
    for (int64_t b0 = j0; b0 < j1; b0 += kBlock) {
      const int64_t nb = std::min(kBlock, j1 - b0);
      std::fill(acc, acc + nb, 0.0f);
      for (int64_t i = 0; i < rows; ++i) axpy_row(acc, M + i * ld + b0, x[i], nb);
      for (int64_t j = 0; j < nb; ++j) store(y + (b0 + j) * incy, acc[j], alpha, beta);
    }
  });
}

template <class T>
void matvec_typed(bool trans, const MatRef& m, const T* x, int64_t incx, float alpha, float beta,
                  float* y, int64_t incy) {
  thread_local std::vector<float> xbuf;
  const T* M = static_cast<const T*>(m.p);
  const int64_t ld = m.rows <= 1 ? m.cols : m.ld;
  const float* xf = gather(x, trans ? m.rows : m.cols, incx, xbuf);
  if (trans)
    axpys(M, m.rows, m.cols, ld, xf, alpha, beta, y, incy);
  else
    dots(M, m.rows, m.cols, ld, xf, alpha, beta, y, incy);
}

}  // namespace

void matvec(bool trans, const MatRef& m, const void* x, int64_t incx, float alpha, float beta,
            float* y, int64_t incy) {
  switch (m.dtype) {
    case DType::F32:
      return matvec_typed(trans, m, static_cast<const float*>(x), incx, alpha, beta, y, incy);
    case DType::BF16:
      return matvec_typed(trans, m, static_cast<const bf16*>(x), incx, alpha, beta, y, incy);
    case DType::F16:
      return matvec_typed(trans, m, static_cast<const fp16*>(x), incx, alpha, beta, y, incy);
    default: MG_CHECK(false, "matvec: matrix must be float32, bfloat16 or float16, got ",
                      dtype_name(m.dtype));
  }
}

}  // namespace megatron::ops::cpu
