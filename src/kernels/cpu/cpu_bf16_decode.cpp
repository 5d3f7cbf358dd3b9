// One query row against bf16 keys and values read in place (decoding from a bf16 KV cache; see
// cpu_attention_bf16.h): the scores and the weighted sum of values on the unit picked at run time.
// AVX512-BF16: a score is `vdpbf16ps` over the key row and the query (32 elements a step, the 16
// lanes summed at the end), the rows read in address order; the values of two keys are
// interleaved into pairs (vpunpck*wd) and multiplied by the pair of their probabilities, up to 128
// columns per pass over the rows, the columns put back in order once at the end. Nothing is
// packed or copied: each key and value is read once, as stored. The fp32 unit widens the same
// bf16 operands through the matrix-vector loops (cpu_matvec.cpp).
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/cpu/cpu_matmul.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 reduction and
// shuffle intrinsics as "may be used uninitialized" when they are inlined into a target("...")
// function; the values are never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace megatron::ops::cpu {

namespace {

#define MG_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

MG_AVX512BF16 inline __mmask32 mask32(int64_t w) {
  return w >= 32 ? __mmask32(0xffffffffu) : w <= 0 ? __mmask32(0) : __mmask32((1u << w) - 1);
}

// Scores of head size up to 32 * NC: the query's chunks stay in registers, each key row is read
// in address order (the hardware prefetchers follow it), four rows' sums in flight.
template <int NC>
MG_AVX512BF16 void scores_chunks(const bf16* k, int64_t rows, int64_t ld, int64_t d,
                                 const bf16* q, float alpha, float* s) {
  __mmask32 m[NC];
  __m512bh qv[NC];
#pragma GCC unroll 4
  for (int n = 0; n < NC; ++n) {
    m[n] = mask32(d - 32 * n);
    qv[n] = (__m512bh)_mm512_maskz_loadu_epi16(m[n], q + 32 * n);
  }
  constexpr int kRows = 4;
  int64_t j = 0;
  for (; j + kRows <= rows; j += kRows) {
    __m512 acc[kRows];
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const bf16* row = k + (j + r) * ld;
      acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int n = 0; n < NC; ++n)
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_maskz_loadu_epi16(m[n], row + 32 * n),
                                  qv[n]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) s[j + r] = alpha * _mm512_reduce_add_ps(acc[r]);
  }
  for (; j < rows; ++j) {
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int n = 0; n < NC; ++n)
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m[n], k + j * ld + 32 * n),
                             qv[n]);
    s[j] = alpha * _mm512_reduce_add_ps(acc);
  }
}

// Any head size: 32 elements a step.
MG_AVX512BF16 void scores_any(const bf16* k, int64_t rows, int64_t ld, int64_t d, const bf16* q,
                              float alpha, float* s) {
  for (int64_t j = 0; j < rows; ++j) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 32) {
      const __mmask32 m = mask32(d - c);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, k + j * ld + c),
                             (__m512bh)_mm512_maskz_loadu_epi16(m, q + c));
    }
    s[j] = alpha * _mm512_reduce_add_ps(acc);
  }
}

MG_AVX512BF16 void scores_avx512bf16(const bf16* k, int64_t rows, int64_t ld, int64_t d,
                                     const bf16* q, float alpha, float* s) {
  if (d > 96 && d <= 128) return scores_chunks<4>(k, rows, ld, d, q, alpha, s);
  if (d > 64 && d <= 96) return scores_chunks<3>(k, rows, ld, d, q, alpha, s);
  if (d > 32 && d <= 64) return scores_chunks<2>(k, rows, ld, d, q, alpha, s);
  if (d <= 32) return scores_chunks<1>(k, rows, ld, d, q, alpha, s);
  scores_any(k, rows, ld, d, q, alpha, s);
}

// Columns [c, c + 32 * NC) of the weighted sum: each pair of value rows is read once, all its
// chunks at a time (NC accumulator pairs in registers).
template <int NC>
MG_AVX512BF16 void values_chunks(const bf16* v, int64_t rows, int64_t ld, int64_t d, int64_t c,
                                 const bf16* p, float beta, float* o, __m512i idx0,
                                 __m512i idx1) {
  __mmask32 m[NC];
  __m512 lo[NC], hi[NC];
#pragma GCC unroll 4
  for (int n = 0; n < NC; ++n) {
    m[n] = mask32(d - c - 32 * n);
    lo[n] = hi[n] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 1 < rows; j += 2) {
    const bf16* r0 = v + j * ld + c;
    _mm_prefetch(reinterpret_cast<const char*>(r0 + 16 * ld), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(r0 + 17 * ld), _MM_HINT_T0);
    const __m512bh pp = (__m512bh)_mm512_set1_epi32(
        int(uint32_t(p[j].bits) | uint32_t(p[j + 1].bits) << 16));
#pragma GCC unroll 4
    for (int n = 0; n < NC; ++n) {
      const __m512i a = _mm512_maskz_loadu_epi16(m[n], r0 + 32 * n);
      const __m512i b = _mm512_maskz_loadu_epi16(m[n], r0 + ld + 32 * n);
      lo[n] = _mm512_dpbf16_ps(lo[n], (__m512bh)_mm512_unpacklo_epi16(a, b), pp);
      hi[n] = _mm512_dpbf16_ps(hi[n], (__m512bh)_mm512_unpackhi_epi16(a, b), pp);
    }
  }
  if (j < rows) {  // the last key alone, paired with zeros (never with the row after it)
    const __m512bh pp = (__m512bh)_mm512_set1_epi32(int(uint32_t(p[j].bits)));
    const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int n = 0; n < NC; ++n) {
      const __m512i a = _mm512_maskz_loadu_epi16(m[n], v + j * ld + c + 32 * n);
      lo[n] = _mm512_dpbf16_ps(lo[n], (__m512bh)_mm512_unpacklo_epi16(a, z), pp);
      hi[n] = _mm512_dpbf16_ps(hi[n], (__m512bh)_mm512_unpackhi_epi16(a, z), pp);
    }
  }
  const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 4
  for (int n = 0; n < NC; ++n) {
    const int64_t at = c + 32 * n, w = std::min<int64_t>(32, d - at);
    if (w <= 0) break;
    __m512 x0 = _mm512_permutex2var_ps(lo[n], idx0, hi[n]);
    __m512 x1 = _mm512_permutex2var_ps(lo[n], idx1, hi[n]);
    const __mmask16 m0 = __mmask16(w >= 16 ? 0xffff : (1u << w) - 1);
    const __mmask16 m1 = __mmask16(w >= 32 ? 0xffff : w <= 16 ? 0 : (1u << (w - 16)) - 1);
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, o + at), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, o + at + 16), x1);
    }
    _mm512_mask_storeu_ps(o + at, m0, x0);
    _mm512_mask_storeu_ps(o + at + 16, m1, x1);
  }
}

MG_AVX512BF16 void values_avx512bf16(const bf16* v, int64_t rows, int64_t ld, int64_t d,
                                     const bf16* p, float beta, float* o) {
  // vpunpcklwd / vpunpckhwd pair columns 8l + (0..3) / 8l + (4..7) of each 128-bit lane l into
  // dword lanes 4l..4l+3 of the low / high accumulator; column c of 32 comes back from there.
  alignas(64) int32_t idx[32];
  for (int c = 0; c < 32; ++c) {
    const int l = c / 8, kk = c % 8;
    idx[c] = kk < 4 ? 4 * l + kk : 16 + 4 * l + (kk - 4);
  }
  const __m512i idx0 = _mm512_load_si512(idx), idx1 = _mm512_load_si512(idx + 16);
  for (int64_t c = 0; c < d; c += 128) {  // up to 128 columns a pass over the rows
    const int64_t left = d - c;
    if (left > 96) values_chunks<4>(v, rows, ld, d, c, p, beta, o, idx0, idx1);
    else if (left > 64) values_chunks<3>(v, rows, ld, d, c, p, beta, o, idx0, idx1);
    else if (left > 32) values_chunks<2>(v, rows, ld, d, c, p, beta, o, idx0, idx1);
    else values_chunks<1>(v, rows, ld, d, c, p, beta, o, idx0, idx1);
  }
}

#undef MG_AVX512BF16

}  // namespace

void decode_scores_bf16(const bf16* k, int64_t rows, int64_t ld, int64_t d, const bf16* q,
                        float alpha, float* s) {
  if (rows <= 0) return;
  if (bf16_tile_unit() == Bf16Unit::Avx512Bf16)
    scores_avx512bf16(k, rows, ld, d, q, alpha, s);
  else
    matvec(false, {k, DType::BF16, rows, d, ld}, q, 1, alpha, 0.0f, s, 1);
}

void decode_values_bf16(const bf16* v, int64_t rows, int64_t ld, int64_t d, const bf16* p,
                        float beta, float* o) {
  if (rows <= 0) {
    if (beta == 0.0f) std::fill_n(o, d, 0.0f);
    return;
  }
  if (bf16_tile_unit() == Bf16Unit::Avx512Bf16)
    values_avx512bf16(v, rows, ld, d, p, beta, o);
  else
    matvec(true, {v, DType::BF16, rows, d, ld}, p, 1, 1.0f, beta, o, 1);
}

}  // namespace megatron::ops::cpu
