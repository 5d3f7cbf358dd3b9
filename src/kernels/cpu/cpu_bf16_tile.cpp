// The bf16 products of the attention kernel's tiles (cpu_attention_bf16.h): packing into the
// row-major A / pair-interleaved B layouts, and C = alpha A B + beta C with fp32 accumulation on
// the unit picked at run time. AVX512-BF16: `vdpbf16ps` adds the two products of a bf16 pair to
// each of 16 fp32 lanes; a block of 8 rows of A against 32 columns of B keeps 16 accumulators in
// registers, each pair of A broadcast once per row. The fp32 unit widens the same bf16 operands
// (exactly) and multiplies them in fp32: the same products, for CPUs without bf16 instructions.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_attention_bf16.h"

namespace megatron::ops::cpu {

namespace {

Bf16Unit detect_unit() {
  return __builtin_cpu_supports("avx512bf16") ? Bf16Unit::Avx512Bf16 : Bf16Unit::Fp32;
}

std::atomic<int> forced_unit{-1};

inline uint32_t load_pair(const bf16* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---- fp32 unit --------------------------------------------------------------------------------

void gemm_fp32(int64_t m, int64_t n, int64_t kp, float alpha, const bf16* a, const bf16* bv,
               float beta, float* c, int64_t ldc) {
  constexpr int64_t kCols = 256;
  float acc[kCols];
  for (int64_t i = 0; i < m; ++i) {
    const bf16* ar = a + i * kp;
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t nc = std::min(kCols, n - j0);
      std::fill_n(acc, nc, 0.0f);
      for (int64_t kk = 0; kk < kp / 2; ++kk) {
        const float a0 = bf16_to_float(ar[2 * kk]), a1 = bf16_to_float(ar[2 * kk + 1]);
        const bf16* b = bv + (kk * n + j0) * 2;
        for (int64_t j = 0; j < nc; ++j)
          acc[j] += a0 * bf16_to_float(b[2 * j]) + a1 * bf16_to_float(b[2 * j + 1]);
      }
      float* cr = c + i * ldc + j0;
      if (beta == 0.0f) {
        for (int64_t j = 0; j < nc; ++j) cr[j] = alpha * acc[j];
      } else {
        for (int64_t j = 0; j < nc; ++j) cr[j] = alpha * acc[j] + beta * cr[j];
      }
    }
  }
}

// ---- AVX512-BF16 unit -------------------------------------------------------------------------

#define MG_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

template <int MR>
MG_AVX512BF16 void block_avx512bf16(int64_t n, int64_t kp, float alpha, const bf16* a,
                                    const bf16* bv, float beta, float* c, int64_t ldc,
                                    int64_t j0, __mmask16 m0, __mmask16 m1) {
  __m512 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const int64_t pairs = kp / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const bf16* b = bv + (kk * n + j0) * 2;
    const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b);
    const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + 32);
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(load_pair(a + r * kp + 2 * kk)));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], av, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], av, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc + j0;
    __m512 x0 = _mm512_mul_ps(va, acc0[r]), x1 = _mm512_mul_ps(va, acc1[r]);
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

MG_AVX512BF16 void gemm_avx512bf16(int64_t m, int64_t n, int64_t kp, float alpha, const bf16* a,
                                   const bf16* bv, float beta, float* c, int64_t ldc) {
  constexpr int kRows = 8;
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const int64_t w = std::min<int64_t>(32, n - j0);
    const __mmask16 m0 = __mmask16(w >= 16 ? 0xffff : (1u << w) - 1);
    const __mmask16 m1 = __mmask16(w >= 32 ? 0xffff : w <= 16 ? 0 : (1u << (w - 16)) - 1);
    int64_t i = 0;
    for (; i + kRows <= m; i += kRows)
      block_avx512bf16<kRows>(n, kp, alpha, a + i * kp, bv, beta, c + i * ldc, ldc, j0, m0, m1);
    switch (m - i) {
#define MG_TAIL(R)                                                                            \
  case R:                                                                                     \
    block_avx512bf16<R>(n, kp, alpha, a + i * kp, bv, beta, c + i * ldc, ldc, j0, m0, m1); \
    break;
      MG_TAIL(1) MG_TAIL(2) MG_TAIL(3) MG_TAIL(4) MG_TAIL(5) MG_TAIL(6) MG_TAIL(7)
#undef MG_TAIL
      default: break;
    }
  }
}

#undef MG_AVX512BF16

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

void gemm_bf16_packed(int64_t m, int64_t n, int64_t kp, float alpha, const bf16* a,
                      const bf16* bv, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (bf16_tile_unit() == Bf16Unit::Avx512Bf16) {
    gemm_avx512bf16(m, n, kp, alpha, a, bv, beta, c, ldc);
  } else {
    gemm_fp32(m, n, kp, alpha, a, bv, beta, c, ldc);
  }
}

// ---- packing ----------------------------------------------------------------------------------

namespace {
inline bf16 to_bf16(float x) { return float_to_bf16(x); }
inline bf16 to_bf16(bf16 x) { return x; }

template <class T>
void pack_a_impl(bf16* dst, const T* src, int64_t ld, int64_t m, int64_t k) {
  const int64_t kp = even_up(k);
  for (int64_t i = 0; i < m; ++i) {
    bf16* d = dst + i * kp;
    const T* s = src + i * ld;
    for (int64_t e = 0; e < k; ++e) d[e] = to_bf16(s[e]);
    if (kp > k) d[k] = bf16{};
  }
}

template <class T>
void pack_b_impl(bf16* dst, const T* src, int64_t ld, int64_t k, int64_t n) {
  for (int64_t e = 0; e < k; ++e) {
    bf16* d = dst + (e / 2) * 2 * n + (e % 2);
    const T* s = src + e * ld;
    for (int64_t j = 0; j < n; ++j) d[2 * j] = to_bf16(s[j]);
  }
  if (k % 2) {
    bf16* d = dst + (k / 2) * 2 * n + 1;
    for (int64_t j = 0; j < n; ++j) d[2 * j] = bf16{};
  }
}
}  // namespace

void pack_a(bf16* dst, const float* src, int64_t ld, int64_t m, int64_t k) {
  pack_a_impl(dst, src, ld, m, k);
}
void pack_a(bf16* dst, const bf16* src, int64_t ld, int64_t m, int64_t k) {
  pack_a_impl(dst, src, ld, m, k);
}

void pack_a_t(bf16* dst, const float* src, int64_t ld, int64_t k, int64_t m) {
  const int64_t kp = even_up(k);
  for (int64_t e = 0; e < k; ++e) {
    const float* s = src + e * ld;
    for (int64_t i = 0; i < m; ++i) dst[i * kp + e] = float_to_bf16(s[i]);
  }
  if (kp > k)
    for (int64_t i = 0; i < m; ++i) dst[i * kp + k] = bf16{};
}

void pack_b(bf16* dst, const float* src, int64_t ld, int64_t k, int64_t n) {
  pack_b_impl(dst, src, ld, k, n);
}
void pack_b(bf16* dst, const bf16* src, int64_t ld, int64_t k, int64_t n) {
  pack_b_impl(dst, src, ld, k, n);
}

void pack_b_t(bf16* dst, const bf16* src, int64_t ld, int64_t n, int64_t k) {
  const int64_t pairs = k / 2;
  for (int64_t j = 0; j < n; ++j) {
    const bf16* s = src + j * ld;
    for (int64_t p = 0; p < pairs; ++p) {
      bf16* d = dst + p * 2 * n + 2 * j;
      d[0] = s[2 * p];
      d[1] = s[2 * p + 1];
    }
    if (k % 2) {
      bf16* d = dst + pairs * 2 * n + 2 * j;
      d[0] = s[k - 1];
      d[1] = bf16{};
    }
  }
}

}  // namespace megatron::ops::cpu
