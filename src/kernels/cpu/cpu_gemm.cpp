// Matrix products through OpenBLAS cblas_sgemm (row-major). Operands may be row-strided views
// (the row stride is the BLAS leading dimension), so column blocks of a fused matrix (e.g. one
// head of the QKV output) are multiplied without copies. OpenBLAS runs single-threaded; large
// products are split into column (or row) blocks of C across the OpenMP threads, so there is one
// thread pool and OpenMP's spinning workers never compete with OpenBLAS's own threads. A product
// with a single output row or column (decoding one token) is a matrix-vector product: it runs
// through cblas_sgemv (OpenBLAS's sgemm with one row is several times slower), split into blocks
// of output entries across the threads.
#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {
namespace {

struct Mat {
  const float* p;
  int64_t rows, cols, ld;
};

Mat as_mat(const char* what, const Tensor& t, int d0) {
  cpu::require_host("gemm", t);
  MG_CHECK(t.defined() && t.dtype() == DType::F32, "gemm: ", what, " must be float32");
  MG_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, "gemm: ", what, " needs unit inner stride");
  int64_t ld = t.size(-1) == 1 && t.size(d0) > 1 ? t.stride(d0) : t.stride(d0);
  if (ld < t.size(-1)) ld = t.size(-1);
  return {t.data<float>(), t.size(d0), t.size(-1), ld};
}

// y = alpha * op(M) x + beta * y with M [rows, cols] (leading dimension ld): y has cols entries
// when trans, else rows. Blocks of output entries (multiples of 16) go to the OpenMP threads.
void sgemv(bool trans, int64_t rows, int64_t cols, float alpha, const float* M, int64_t ld,
           const float* x, int64_t incx, float beta, float* y, int64_t incy) {
  const int64_t ny = trans ? cols : rows;
  if (beta == 0.0f)  // BLAS's scaling by beta = 0 may keep NaNs of an unwritten output
    for (int64_t j = 0; j < ny; ++j) y[j * incy] = 0.0f;
  auto call = [&](int64_t j0, int64_t j1) {
    if (trans)
      cblas_sgemv(CblasRowMajor, CblasTrans, int(rows), int(j1 - j0), alpha, M + j0, int(ld), x,
                  int(incx), beta, y + j0 * incy, int(incy));
    else
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(j1 - j0), int(cols), alpha, M + j0 * ld,
                  int(ld), x, int(incx), beta, y + j0 * incy, int(incy));
  };
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (nt == 1 || double(rows) * double(cols) < 1.0e5 || ny < 32) {
    call(0, ny);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t j0 = (ny * t / T) & ~int64_t(15);
    const int64_t j1 = t + 1 == T ? ny : (ny * (t + 1) / T) & ~int64_t(15);
    if (j1 > j0) call(j0, j1);
  }
}

void sgemm(const Mat& a, bool ta, const Mat& b, bool tb, const Mat& c, float alpha, float beta) {
  int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  int64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  MG_CHECK(k == kb && c.rows == m && c.cols == n, "gemm: shapes do not match (m=", m, " k=", k,
           " kb=", kb, " n=", n, " c=", c.rows, "x", c.cols, ")");
  if (m == 0 || n == 0) return;
  cpu::blas_single_threaded();
  float* cp = const_cast<float*>(c.p);
  if (k > 0 && m == 1) {  // c row = op(b)^T op(a) row
    sgemv(!tb, b.rows, b.cols, alpha, b.p, b.ld, a.p, ta ? a.ld : 1, beta, cp, 1);
    return;
  }
  if (k > 0 && n == 1) {  // c column = op(a) op(b) column
    sgemv(ta, a.rows, a.cols, alpha, a.p, a.ld, b.p, tb ? 1 : b.ld, beta, cp, c.ld);
    return;
  }
  auto call = [&](int64_t mm, int64_t nn, const float* ap, const float* bp, float* cc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                int(mm), int(nn), int(k), alpha, ap, int(a.ld), bp, int(b.ld), beta, cc,
                int(c.ld));
  };
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (nt == 1 || double(m) * double(n) * double(k) < 2.0e6) {
    call(m, n, a.p, b.p, cp);
    return;
  }
  if (n >= m) {  // column blocks of C (multiples of 16 columns)
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t j0 = (n * t / T) & ~int64_t(15), j1 = t + 1 == T ? n : (n * (t + 1) / T) & ~int64_t(15);
      if (j1 > j0) call(m, j1 - j0, a.p, tb ? b.p + j0 * b.ld : b.p + j0, cp + j0);
    }
  } else {  // row blocks of C
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t i0 = m * t / T, i1 = m * (t + 1) / T;
      if (i1 > i0) call(i1 - i0, n, ta ? a.p + i0 : a.p + i0 * a.ld, b.p, cp + i0 * c.ld);
    }
  }
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha, float beta) {
  MG_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "gemm: operands must be 2-D");
  sgemm(as_mat("a", a, 0), trans_a, as_mat("b", b, 0), trans_b, as_mat("c", c, 0), alpha, beta);
}

void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha, float beta) {
  MG_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3, "gemm_batched: operands must be 3-D");
  int64_t batch = c.size(0);
  MG_CHECK(a.size(0) == batch && b.size(0) == batch, "gemm_batched: batch sizes differ");
  for (int64_t i = 0; i < batch; ++i) {
    Mat ma = as_mat("a", a, 1), mb = as_mat("b", b, 1), mc = as_mat("c", c, 1);
    ma.p += i * a.stride(0);
    mb.p += i * b.stride(0);
    mc.p += i * c.stride(0);
    sgemm(ma, trans_a, mb, trans_b, mc, alpha, beta);
  }
}

}  // namespace megatron::ops::cpu
