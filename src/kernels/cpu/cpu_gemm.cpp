// ops::gemm and ops::gemm_batched on the CPU: operand checks, then cpu::matmul (cpu_matmul.h:
// oneDNN for products, the matrix-vector loops for one output row or column). Operands may be
// row-strided views (the row stride is the leading dimension), so column blocks of a fused matrix
// (one head of the QKV output) are multiplied without copies. fp32 operands give an fp32 product;
// bf16 (or fp16) operands give the product of those values accumulated in fp32.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_matmul.h"

namespace megatron::ops::cpu {
namespace {

bool is_matmul_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// The last two dims of t as a row-major matrix (d0: the row dim).
MatRef as_mat(const char* op, const char* what, const Tensor& t, int d0) {
  cpu::require_host(op, t);
  MG_CHECK(t.defined(), op, ": ", what, " is undefined");
  MG_CHECK(is_matmul_dtype(t.dtype()), op, ": ", what, " must be float32, bfloat16 or float16, got ",
           dtype_name(t.dtype()));
  MG_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, op, ": ", what, " needs unit inner stride");
  int64_t ld = t.stride(d0);
  if (ld < t.size(-1)) ld = t.size(-1);
  return {t.raw_data(), t.dtype(), t.size(d0), t.size(-1), ld};
}

void check(const char* op, const MatRef& a, bool ta, const MatRef& b, bool tb, const MatRef& c) {
  MG_CHECK(a.dtype == b.dtype, op, ": a is ", dtype_name(a.dtype), " and b ", dtype_name(b.dtype),
           "; cast one so both have the same dtype (bf16 operands give a bf16 product)");
  MG_CHECK(c.dtype == DType::F32, op, ": c must be float32 (products accumulate in fp32), got ",
           dtype_name(c.dtype));
  const int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const int64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  MG_CHECK(k == kb && c.rows == m && c.cols == n, op, ": shapes do not match (m=", m, " k=", k,
           " kb=", kb, " n=", n, " c=", c.rows, "x", c.cols, ")");
}

float* out(const MatRef& c) { return static_cast<float*>(const_cast<void*>(c.p)); }

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha, float beta) {
  MG_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "gemm: operands must be 2-D");
  const MatRef ma = as_mat("gemm", "a", a, 0), mb = as_mat("gemm", "b", b, 0),
               mc = as_mat("gemm", "c", c, 0);
  check("gemm", ma, trans_a, mb, trans_b, mc);
  matmul(ma, trans_a, mb, trans_b, out(mc), mc.ld, alpha, beta);
}

void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha, float beta) {
  MG_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3, "gemm_batched: operands must be 3-D");
  const int64_t batch = c.size(0);
  MG_CHECK(a.size(0) == batch && b.size(0) == batch, "gemm_batched: batch sizes differ");
  MatRef ma = as_mat("gemm_batched", "a", a, 1), mb = as_mat("gemm_batched", "b", b, 1),
         mc = as_mat("gemm_batched", "c", c, 1);
  check("gemm_batched", ma, trans_a, mb, trans_b, mc);
  const size_t ea = dtype_size(a.dtype()), eb = dtype_size(b.dtype());
  const char* pa = static_cast<const char*>(ma.p);
  const char* pb = static_cast<const char*>(mb.p);
  for (int64_t i = 0; i < batch; ++i) {
    ma.p = pa + size_t(i * a.stride(0)) * ea;
    mb.p = pb + size_t(i * b.stride(0)) * eb;
    matmul(ma, trans_a, mb, trans_b, out(mc) + i * c.stride(0), mc.ld, alpha, beta);
  }
}

}  // namespace megatron::ops::cpu
