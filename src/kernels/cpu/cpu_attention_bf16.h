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

#include "kernels/cpu/cpu_attention_common.h"

namespace megatron::ops::cpu {

// ---- bf16 products on packed operands ---------------------------------------------------------
// A is row-major bf16 [m, kp] (kp even: the reduction length rounded up, zero padded); B is bf16
// in pairs along the reduction ("VNNI" layout) [kp / 2, n, 2]: element (k, j) at (k / 2) * 2n +
// 2j + k % 2. C [m, n] fp32 (leading dimension ldc) = alpha A B + beta C, fp32 accumulation; beta
// 0 ignores C's old values.
enum class Bf16Unit { Fp32, Avx512Bf16 };
const char* bf16_unit_name(Bf16Unit u);  // "avx512_bf16 (vdpbf16ps)", "fp32 (no bf16 unit)"
// The unit the CPU offers (avx512_bf16 in its flags), unless forced with set_bf16_tile_unit.
Bf16Unit bf16_tile_unit();
// Forces a unit (tests: the fallback on any CPU); forcing one the CPU lacks is an error.
void set_bf16_tile_unit(Bf16Unit u);
void reset_bf16_tile_unit();  // back to the CPU's own

void gemm_bf16_packed(int64_t m, int64_t n, int64_t kp, float alpha, const bf16* a,
                      const bf16* bv, float beta, float* c, int64_t ldc);

// Packing into those layouts, from fp32 (rounded to nearest even) or bf16 sources; rows of the
// source at src + r * ld. Reduction lengths are padded with zeros to kp = round_up(k, 2).
inline int64_t even_up(int64_t k) { return (k + 1) & ~int64_t(1); }
// A per-thread bf16 work buffer (packed operands).
struct Bf16Buffer {
  std::unique_ptr<bf16[]> p;
  explicit Bf16Buffer(int64_t n) : p(std::make_unique<bf16[]>(size_t(std::max<int64_t>(n, 1)))) {}
  bf16* data() const { return p.get(); }
};
// A = src [m, k]
void pack_a(bf16* dst, const float* src, int64_t ld, int64_t m, int64_t k);
void pack_a(bf16* dst, const bf16* src, int64_t ld, int64_t m, int64_t k);
// A = src^T, src [k, m]
void pack_a_t(bf16* dst, const float* src, int64_t ld, int64_t k, int64_t m);
// B = src [k, n]
void pack_b(bf16* dst, const float* src, int64_t ld, int64_t k, int64_t n);
void pack_b(bf16* dst, const bf16* src, int64_t ld, int64_t k, int64_t n);
// B = src^T, src [n, k]
void pack_b_t(bf16* dst, const bf16* src, int64_t ld, int64_t n, int64_t k);

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
