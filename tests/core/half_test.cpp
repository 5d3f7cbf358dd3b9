// bf16/fp16 conversions against exhaustive and reference checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/half.h"

using namespace megatron;

namespace {
// Reference rounding: pick the nearest representable value by comparing in double, ties to even.
template <typename H, typename ToF>
uint16_t nearest(float x, ToF to_float) {
  double best_err = INFINITY;
  uint16_t best = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    float v = to_float(H{uint16_t(b)});
    if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
    double err = std::fabs(double(v) - double(x));
    if (err < best_err || (err == best_err && (b & 1) == 0 && (best & 1) == 1)) {
      best_err = err;
      best = uint16_t(b);
    }
  }
  return best;
}
}  // namespace

TEST(Half, Bf16RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_float(bf16{uint16_t(b)});
    uint16_t back = float_to_bf16(f).bits;
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(bf16{back})));
    } else {
      ASSERT_EQ(back, b) << "bits " << b;
    }
  }
}

TEST(Half, Fp16RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = fp16_to_float(fp16{uint16_t(b)});
    uint16_t back = float_to_fp16(f).bits;
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(fp16{back})));
    } else {
      ASSERT_EQ(back, b) << "bits " << b;
    }
  }
}

TEST(Half, Fp16KnownValues) {
  EXPECT_EQ(float_to_fp16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_fp16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f).bits, 0x7c00);  // tie above max rounds to inf
  EXPECT_EQ(float_to_fp16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even zero
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(float_to_fp16(-2.0f).bits, 0xc000);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(1e9f))));
}

TEST(Half, RoundToNearestEvenMatchesBruteForce) {
  // Midpoints and random values between representable numbers, both formats.
  uint32_t state = 12345;
  for (int i = 0; i < 3000; ++i) {
    state = state * 1664525u + 1013904223u;
    float x = std::ldexp(float(state >> 8) / float(1 << 24), int(state % 40) - 30);
    if (state & 1) x = -x;
    ASSERT_EQ(float_to_bf16(x).bits, nearest<bf16>(x, bf16_to_float)) << x;
    ASSERT_EQ(float_to_fp16(x).bits, nearest<fp16>(x, fp16_to_float)) << x;
  }
  // Exact ties for bf16: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
}
