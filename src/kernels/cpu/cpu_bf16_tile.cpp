// The bf16 products of the attention kernel's tiles (cpu_attention_bf16.h): packing into bf16
// pairs along the reduction, and C = alpha A B + beta C with fp32 accumulation on the unit picked
// at run time. AVX512-BF16: `vdpbf16ps` adds the two products of a bf16 pair to each of 16 fp32
// lanes; a block of 8 rows of A against 32 columns of B keeps 16 accumulators in registers, each
// pair of A broadcast once per row. The fp32 unit widens the same bf16 operands (exactly) and
// multiplies them in fp32: the same products, for CPUs without bf16 instructions. The packing
// loops are plain C++ that the compiler vectorises (rounding without branches).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_attention_bf16.h"

namespace megatron::ops::cpu {

namespace {

Bf16Unit detect_unit() {
  return __builtin_cpu_supports("avx512bf16") ? Bf16Unit::Avx512Bf16 : Bf16Unit::Fp32;
}

std::atomic<int> forced_unit{-1};

inline float lo_of(uint32_t p) { return std::bit_cast<float>(p << 16); }
inline float hi_of(uint32_t p) { return std::bit_cast<float>(p & 0xffff0000u); }

// ---- fp32 unit --------------------------------------------------------------------------------

// Up to kRows rows of A at once, so that each widened pair of B serves them all.
void gemm_fp32(int64_t m, int64_t n, int64_t pairs, float alpha, PairsA a, const uint32_t* b,
               int64_t ldb, float beta, float* c, int64_t ldc) {
  constexpr int64_t kCols = 128, kRows = 4;
  float acc[kRows][kCols];
  for (int64_t i0 = 0; i0 < m; i0 += kRows) {
    const int64_t mr = std::min(kRows, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t nc = std::min(kCols, n - j0);
      for (int64_t r = 0; r < kRows; ++r) std::fill_n(acc[r], nc, 0.0f);
      for (int64_t kk = 0; kk < pairs; ++kk) {
        float a0[kRows] = {}, a1[kRows] = {};
        for (int64_t r = 0; r < mr; ++r) {
          const uint32_t ap = a.p[(i0 + r) * a.row + kk * a.pair];
          a0[r] = lo_of(ap);
          a1[r] = hi_of(ap);
        }
        const uint32_t* br = b + kk * ldb + j0;
        for (int64_t j = 0; j < nc; ++j) {
          const float b0 = lo_of(br[j]), b1 = hi_of(br[j]);
          for (int64_t r = 0; r < kRows; ++r) acc[r][j] += a0[r] * b0 + a1[r] * b1;
        }
      }
      for (int64_t r = 0; r < mr; ++r) {
        float* cr = c + (i0 + r) * ldc + j0;
        if (beta == 0.0f) {
          for (int64_t j = 0; j < nc; ++j) cr[j] = alpha * acc[r][j];
        } else {
          for (int64_t j = 0; j < nc; ++j) cr[j] = alpha * acc[r][j] + beta * cr[j];
        }
      }
    }
  }
}

// ---- AVX512-BF16 unit -------------------------------------------------------------------------

#define MG_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

template <int MR>
MG_AVX512BF16 void block_avx512bf16(int64_t pairs, float alpha, PairsA a, const uint32_t* b,
                                    int64_t ldb, float beta, float* c, int64_t ldc,
                                    __mmask16 m0, __mmask16 m1) {
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const uint32_t* br = b + kk * ldb;
    const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, br);
    const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, br + 16);
    const uint32_t* ar = a.p + kk * a.pair;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ar[r * a.row]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], av, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], av, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, acc0[r]), x1 = _mm512_mul_ps(va, acc1[r]);
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

MG_AVX512BF16 void gemm_avx512bf16(int64_t m, int64_t n, int64_t pairs, float alpha, PairsA a,
                                   const uint32_t* b, int64_t ldb, float beta, float* c,
                                   int64_t ldc) {
  constexpr int kRows = 8;
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const int64_t w = std::min<int64_t>(32, n - j0);
    const __mmask16 m0 = __mmask16(w >= 16 ? 0xffff : (1u << w) - 1);
    const __mmask16 m1 = __mmask16(w >= 32 ? 0xffff : w <= 16 ? 0 : (1u << (w - 16)) - 1);
    int64_t i = 0;
    const auto at = [&](int64_t row) { return PairsA{a.p + row * a.row, a.row, a.pair}; };
    for (; i + kRows <= m; i += kRows)
      block_avx512bf16<kRows>(pairs, alpha, at(i), b + j0, ldb, beta, c + i * ldc + j0, ldc, m0, m1);
    switch (m - i) {
#define MG_TAIL(R)                                                                             \
  case R:                                                                                      \
    block_avx512bf16<R>(pairs, alpha, at(i), b + j0, ldb, beta, c + i * ldc + j0, ldc, m0, m1); \
    break;
      MG_TAIL(1) MG_TAIL(2) MG_TAIL(3) MG_TAIL(4) MG_TAIL(5) MG_TAIL(6) MG_TAIL(7)
#undef MG_TAIL
      default: break;
    }
  }
}

#undef MG_AVX512BF16

// Round to nearest even, quiet NaNs kept; no branches, so the loops below vectorise.
inline uint32_t round_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r;
}
inline uint32_t bits_of(float f) { return round_bf16(f); }
inline uint32_t bits_of(bf16 h) { return h.bits; }

template <class T>
void pairs_cols(uint32_t* dst, int64_t ldd, const T* src, int64_t ld, int64_t rows, int64_t cols,
                int lead) {
  const int64_t whole = (cols + lead) / 2;  // pairs with both elements in the (shifted) row
  for (int64_t i = 0; i < rows; ++i) {
    const T* s = src + i * ld;
    uint32_t* d = dst + i * ldd;
    if (lead) {  // pair kk = (s[2kk - 1], s[2kk]), s[-1] = 0
      if (cols > 0) d[0] = bits_of(s[0]) << 16;
      for (int64_t kk = 1; kk < whole; ++kk)
        d[kk] = bits_of(s[2 * kk - 1]) | bits_of(s[2 * kk]) << 16;
      if ((cols + 1) % 2) d[whole] = bits_of(s[cols - 1]);
    } else {
      for (int64_t kk = 0; kk < whole; ++kk) d[kk] = bits_of(s[2 * kk]) | bits_of(s[2 * kk + 1]) << 16;
      if (cols % 2) d[whole] = bits_of(s[cols - 1]);
    }
  }
}

template <class T>
void pairs_rows(uint32_t* dst, int64_t ldd, const T* src, int64_t ld, int64_t rows,
                int64_t cols) {
  for (int64_t kk = 0; kk < rows / 2; ++kk) {
    const T* r0 = src + 2 * kk * ld;
    const T* r1 = r0 + ld;
    uint32_t* d = dst + kk * ldd;
    for (int64_t j = 0; j < cols; ++j) d[j] = bits_of(r0[j]) | bits_of(r1[j]) << 16;
  }
  if (rows % 2) {
    const T* r0 = src + (rows - 1) * ld;
    uint32_t* d = dst + (rows / 2) * ldd;
    for (int64_t j = 0; j < cols; ++j) d[j] = bits_of(r0[j]);
  }
}

}  // namespace

const char* bf16_unit_name(Bf16Unit u) {
  return u == Bf16Unit::Avx512Bf16 ? "avx512_bf16 (vdpbf16ps)" : "fp32 (no bf16 unit)";
}

Bf16Unit bf16_tile_unit() {
  static const Bf16Unit cpu = detect_unit();
  const int f = forced_unit.load(std::memory_order_relaxed);
  return f < 0 ? cpu : Bf16Unit(f);
}

void set_bf16_tile_unit(Bf16Unit u) {
  MG_REQUIRE(u == Bf16Unit::Fp32 || detect_unit() == Bf16Unit::Avx512Bf16,
             "bf16 attention: this CPU has no ", bf16_unit_name(u),
             " (its flags lack avx512_bf16); pick the fp32 unit");
  forced_unit.store(int(u), std::memory_order_relaxed);
}

void reset_bf16_tile_unit() { forced_unit.store(-1, std::memory_order_relaxed); }

std::vector<Bf16Unit> bf16_units_available() {
  reset_bf16_tile_unit();
  std::vector<Bf16Unit> u{bf16_tile_unit()};
  if (u[0] != Bf16Unit::Fp32) u.push_back(Bf16Unit::Fp32);
  return u;
}

void gemm_bf16_pairs(int64_t m, int64_t n, int64_t pairs, float alpha, PairsA a,
                     const uint32_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (bf16_tile_unit() == Bf16Unit::Avx512Bf16) {
    gemm_avx512bf16(m, n, pairs, alpha, a, b, ldb, beta, c, ldc);
  } else {
    gemm_fp32(m, n, pairs, alpha, a, b, ldb, beta, c, ldc);
  }
}

void pack_pairs_cols(uint32_t* dst, int64_t ldd, const float* src, int64_t ld, int64_t rows,
                     int64_t cols, int lead) {
  pairs_cols(dst, ldd, src, ld, rows, cols, lead);
}
void pack_pairs_cols(uint32_t* dst, int64_t ldd, const bf16* src, int64_t ld, int64_t rows,
                     int64_t cols) {
  pairs_cols(dst, ldd, src, ld, rows, cols, 0);
}

void pack_pairs_cols_t(uint32_t* dst, int64_t ldd, const bf16* src, int64_t ld, int64_t rows,
                       int64_t cols) {
  // 16 source rows at a time: their pairs stay in the L1 cache while each pair row of dst gets
  // 16 consecutive words.
  constexpr int64_t kBlock = 16;
  const int64_t whole = cols / 2;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const int64_t i1 = std::min(rows, i0 + kBlock);
    for (int64_t kk = 0; kk < whole; ++kk) {
      uint32_t* d = dst + kk * ldd;
      for (int64_t i = i0; i < i1; ++i) {
        const bf16* s = src + i * ld + 2 * kk;
        d[i] = uint32_t(s[0].bits) | uint32_t(s[1].bits) << 16;
      }
    }
    if (cols % 2)
      for (int64_t i = i0; i < i1; ++i) dst[whole * ldd + i] = src[i * ld + cols - 1].bits;
  }
}

void pack_pairs_rows(uint32_t* dst, int64_t ldd, const float* src, int64_t ld, int64_t rows,
                     int64_t cols) {
  pairs_rows(dst, ldd, src, ld, rows, cols);
}
void pack_pairs_rows(uint32_t* dst, int64_t ldd, const bf16* src, int64_t ld, int64_t rows,
                     int64_t cols) {
  pairs_rows(dst, ldd, src, ld, rows, cols);
}

}  // namespace megatron::ops::cpu
