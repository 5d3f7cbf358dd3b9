// Matrix products of the CPU backend on raw row-major operands, for ops::gemm / gemm_batched
// (cpu_gemm.cpp) and the attention kernels (cpu::sgemm). Three routes, chosen per call:
//   - products with more than one output row and column go through oneDNN's matmul primitive
//     (fp32, or bf16 x bf16 with fp32 accumulation and output: AMX tiles, AVX512-BF16 or
//     AVX-512, whatever oneDNN finds on the CPU at run time). Primitives are created once per
//     shape (dimensions, transposes, leading dimensions, dtypes, alpha, beta, threads) and kept
//     in a cache shared by all threads;
//   - a product with one output row or column (decoding one token) is a matrix-vector product,
//     memory-bound: oneDNN's matmul repacks the whole matrix on every call there, so it runs
//     through the dot and axpy loops of cpu_matvec.cpp, which read each element once, split
//     across the OpenMP threads;
//   - half-precision operands oneDNN has no kernel for on this CPU (fp16 before AVX512-FP16,
//     bf16 before AVX-512) are widened to fp32 (exact) and multiplied in fp32: the same
//     products, accumulated in fp32 as the half-precision kernels do.
// A call made from inside an OpenMP region (the attention kernels' per-head work) runs on the
// calling thread: oneDNN's sgemm, which never starts threads of its own there.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace megatron::ops::cpu {

// rows x cols, row i at p + i * ld elements (ld >= cols, or anything when rows == 1).
struct MatRef {
  const void* p;
  DType dtype;  // F32, BF16 or F16
  int64_t rows, cols, ld;
};

// c [m, n] (fp32, leading dimension ldc) = alpha op(a) op(b) + beta c, op = transpose when
// trans. a and b have the same dtype. beta == 0 ignores c's old values (NaNs included).
void matmul(const MatRef& a, bool trans_a, const MatRef& b, bool trans_b, float* c, int64_t ldc,
            float alpha, float beta);

// fp32 product on raw pointers (row-major, as cblas_sgemm): the attention kernels' blocks.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y = alpha op(M) x + beta y for M [rows, cols] (leading dimension ld), op(M) = M^T when trans;
// x has M's dtype (stride incx), y is fp32 (stride incy). Products are formed in fp32 from the
// exact values and summed in fp32; every output is one thread's, in a fixed order.
void matvec(bool trans, const MatRef& m, const void* x, int64_t incx, float alpha, float beta,
            float* y, int64_t incy);

// What the products run on, for `megatron version` and the start-up log (cpu_kernels.h).
struct MatmulKernels {
  std::string onednn_version;  // "2.6.3"
  std::string onednn_isa;      // the ISA oneDNN dispatches to: "avx512_core_bf16", ...
  std::string f32, bf16, f16;  // kernel of a large product per dtype: "oneDNN brg:avx512_core"
  bool bf16_native = false;    // bf16 products run on a bf16 kernel (not widened to fp32)
  bool f16_native = false;
};
const MatmulKernels& matmul_kernels();

}  // namespace megatron::ops::cpu
