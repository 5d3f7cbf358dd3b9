// Matrix products through OpenBLAS cblas_sgemm (row-major). Operands may be row-strided views
// (the row stride is the BLAS leading dimension), so column blocks of a fused matrix (e.g. one
// head of the QKV output) are multiplied without copies.
#include <cblas.h>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace megatron::ops {
namespace {

struct Mat {
  const float* p;
  int64_t rows, cols, ld;
};

Mat as_mat(const char* what, const Tensor& t, int d0) {
  cpu::require_cpu("gemm", t);
  MG_CHECK(t.defined() && t.dtype() == DType::F32, "gemm: ", what, " must be float32");
  MG_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, "gemm: ", what, " needs unit inner stride");
  int64_t ld = t.size(-1) == 1 && t.size(d0) > 1 ? t.stride(d0) : t.stride(d0);
  if (ld < t.size(-1)) ld = t.size(-1);
  return {t.data<float>(), t.size(d0), t.size(-1), ld};
}

void sgemm(const Mat& a, bool ta, const Mat& b, bool tb, const Mat& c, float alpha, float beta) {
  int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  int64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  MG_CHECK(k == kb && c.rows == m && c.cols == n, "gemm: shapes do not match (m=", m, " k=", k,
           " kb=", kb, " n=", n, " c=", c.rows, "x", c.cols, ")");
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a.p, int(a.ld), b.p, int(b.ld), beta,
              const_cast<float*>(c.p), int(c.ld));
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

}  // namespace megatron::ops
