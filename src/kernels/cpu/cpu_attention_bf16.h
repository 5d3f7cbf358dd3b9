// The core attention op's bf16 kernel (cpu_attention_bf16.cpp, cpu_attention_bf16_bwd.cpp): when
// q, k and v are bf16 tensors (a bf16 model's activations, a bf16 KV cache), the flash-style loops
// of cpu_attention.cpp run with their products Q K^T, P V (and in backward dO V^T, Pd^T dO, dS K,
// dS^T Q) on bf16 operands with fp32 accumulation, on the CPU's bf16 dot-product unit: the
// probabilities and the incoming gradient are rounded to bf16 for their products, as a bf16 flash
// attention does; the softmax (maximum, exponentials, sums, log-sum-exp), the masks, the bias,
// ALiBi, dropout and every output and gradient stay fp32. The unit is picked at run time from the
// CPU's flags (bf16_tile_unit()): AVX512-BF16 (`vdpbf16ps`, also what runs on CPUs with AMX), or
// plain fp32 arithmetic on the same bf16 operands where the CPU has no bf16 instructions.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_attention_common.h"

namespace megatron::ops::cpu {

// ---- bf16 products on packed operands ---------------------------------------------------------
// Operands are packed as bf16 pairs along the reduction dimension, one uint32_t per pair (the
// even element in the low half, as `vdpbf16ps` reads them; a missing odd element is zero):
//   A [m, k]: pair (i, kk) = (A[i][2kk], A[i][2kk+1]) at a.p[i * a.row + kk * a.pair]
//   B [k, n]: pair (kk, j) = (B[2kk][j], B[2kk+1][j]) at b[kk * ldb + j]
// C [m, n] fp32 (leading dimension ldc) = alpha A B + beta C, summed in fp32; beta 0 ignores C's
// old values.
enum class Bf16Unit { Fp32, Avx512Bf16 };
const char* bf16_unit_name(Bf16Unit u);  // "avx512_bf16 (vdpbf16ps)", "fp32 (no bf16 unit)"
// The unit the CPU offers (avx512_bf16 in its flags), unless forced with set_bf16_tile_unit.
Bf16Unit bf16_tile_unit();
// Forces a unit (tests and benchmarks: the fallback on any CPU); forcing one the CPU lacks is
// an error.
void set_bf16_tile_unit(Bf16Unit u);
void reset_bf16_tile_unit();  // back to the CPU's own
// The units this CPU can run: its own (reset first) and, where that is not it, the fp32 unit (tests
// and benchmarks run each).
std::vector<Bf16Unit> bf16_units_available();

struct PairsA {
  const uint32_t* p;
  int64_t row, pair;
};
void gemm_bf16_pairs(int64_t m, int64_t n, int64_t pairs, float alpha, PairsA a,
                     const uint32_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Packing from a row-major source [rows, cols] (row r at src + r * ld), fp32 sources rounded to
// nearest even. dst's pair rows are ldd apart.
inline int64_t pairs_of(int64_t k) { return (k + 1) / 2; }
// A leading dimension for n pairs a row whose rows do not fall into the same few cache sets (a
// multiple of 1024 words apart would).
inline int64_t pair_ld(int64_t n) { return (n + 15) / 16 * 16 + 16; }
// Pairs along the columns: dst[i * ldd + kk] = (src[i][2kk - lead], src[i][2kk + 1 - lead]), where
// lead (0 or 1) shifts the row right by one zero (a reduction that starts one element early, at an
// even key), for kk < pairs_of(cols + lead).
void pack_pairs_cols(uint32_t* dst, int64_t ldd, const float* src, int64_t ld, int64_t rows,
                     int64_t cols, int lead = 0);
void pack_pairs_cols(uint32_t* dst, int64_t ldd, const bf16* src, int64_t ld, int64_t rows,
                     int64_t cols);
// The same pairs transposed: dst[kk * ldd + i] (B = src^T).
void pack_pairs_cols_t(uint32_t* dst, int64_t ldd, const bf16* src, int64_t ld, int64_t rows,
                       int64_t cols);
// Pairs along the rows: dst[kk * ldd + j] = (src[2kk][j], src[2kk + 1][j]), kk < pairs_of(rows).
void pack_pairs_rows(uint32_t* dst, int64_t ldd, const float* src, int64_t ld, int64_t rows,
                     int64_t cols);
void pack_pairs_rows(uint32_t* dst, int64_t ldd, const bf16* src, int64_t ld, int64_t rows,
                     int64_t cols);

// A per-thread buffer of packed pairs, left uninitialised (every use writes before it reads).
struct PairBuffer {
  std::unique_ptr<uint32_t[]> p;
  explicit PairBuffer(int64_t n)
      : p(std::make_unique_for_overwrite<uint32_t[]>(size_t(std::max<int64_t>(n, 1)))) {}
  uint32_t* data() const { return p.get(); }
};

// ---- one query row against bf16 keys and values in place (decoding; cpu_bf16_decode.cpp) -----
// s[j] = alpha * dot(k row j, q) for j < rows (k's rows ld elements apart, d elements each).
void decode_scores_bf16(const bf16* k, int64_t rows, int64_t ld, int64_t d, const bf16* q,
                        float alpha, float* s);
// o[e] = sum_j p[j] v[j][e] + beta * o[e] for e < d (beta 0 ignores o's old values).
void decode_values_bf16(const bf16* v, int64_t rows, int64_t ld, int64_t d, const bf16* p,
                        float beta, float* o);

// ---- the kernel -------------------------------------------------------------------------------
// Called by attention_fwd / attention_bwd once the plan is checked and q, k, v are bf16.
void attention_fwd_bf16(const AttentionPlan& P, const Tensor& out, const Tensor& lse,
                        const Tensor& probs, const DropoutSpec& dropout);

struct Bf16BackwardArgs {
  HeadOperand dq, dk, dv;  // fp32
  const float *dout, *out, *lse, *probs;
  float* dbias;  // dbias itself, or per-batch-row parts (dbias_per_row)
  bool dbias_per_row;
  bool accumulate;
};
void attention_bwd_bf16(const AttentionPlan& P, const Bf16BackwardArgs& a,
                        const DropoutSpec& dropout);

}  // namespace megatron::ops::cpu
