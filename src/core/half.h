// bf16 and fp16 storage types with correct conversions.
// float -> bf16/fp16 rounds to nearest, ties to even; NaN stays NaN (quiet), overflow goes to
// infinity, fp16 subnormals are produced exactly. Arithmetic is always done in float.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace megatron {

struct bf16 {
  uint16_t bits = 0;
};
struct fp16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(uint32_t(h.bits) << 16); }

inline bf16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t((u + rounding) >> 16)};
}

inline float fp16_to_float(fp16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else {
    out = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(out);
}

inline fp16 float_to_fp16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16{uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return fp16{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal (2^-14): subnormal or zero
    // value = abs_float; subnormal unit is 2^-24. Round to nearest even of value * 2^24.
    if (abs < 0x33000000u) return fp16{sign};  // < 2^-25: rounds to zero (ties to even 0)
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // bits to drop so the unit is 2^-24: (exp-127) - (-24) - 23
    uint32_t kept = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (kept & 1u))) ++kept;
    return fp16{uint16_t(sign | kept)};
  }
  // normal: rebias exponent and round mantissa from 23 to 10 bits
  uint32_t v = abs - ((127u - 15u) << 23);
  uint32_t rounding = 0xfffu + ((v >> 13) & 1u);
  v += rounding;
  return fp16{uint16_t(sign | (v >> 13))};
}

}  // namespace megatron
