// Rotary embeddings on the fused QKV activation against a double reference written from
// Megatron-Core's formulas (cat(freqs, freqs) or the interleaved stack, x cos + rotate_half(x)
// sin), both pair layouts, partial rotation (rotary_percent < 1), GQA, head_dim not a multiple
// of 8, one row, large positions; the backward against central differences; ALiBi slopes
// against the values of Press et al.'s construction.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;
using testing::to_double;

// Megatron-Core's rotation of one head (double): emb[k] is the angle of dim k (k < rot).
void rotate_ref(double* x, int rot, int64_t pos, double base, bool interleaved) {
  std::vector<double> emb(static_cast<size_t>(rot)), rotated(static_cast<size_t>(rot));
  for (int i = 0; i < rot / 2; ++i) {
    const double freq = double(pos) / std::pow(base, double(2 * i) / double(rot));
    if (interleaved) {
      emb[size_t(2 * i)] = emb[size_t(2 * i + 1)] = freq;
    } else {
      emb[size_t(i)] = emb[size_t(i + rot / 2)] = freq;
    }
  }
  for (int k = 0; k < rot; ++k) {  // _rotate_half
    if (interleaved)
      rotated[size_t(k)] = k % 2 == 0 ? -x[k + 1] : x[k - 1];
    else
      rotated[size_t(k)] = k < rot / 2 ? -x[k + rot / 2] : x[k - rot / 2];
  }
  for (int k = 0; k < rot; ++k)
    x[k] = x[k] * std::cos(emb[size_t(k)]) + rotated[size_t(k)] * std::sin(emb[size_t(k)]);
}

std::vector<double> rope_ref(std::vector<double> x, const std::vector<int32_t>& pos, int n, int g,
                             int d, const RotaryConfig& rc) {
  const int hpg = n / g;
  const int64_t W = int64_t(g) * (hpg + 2) * d;
  for (size_t r = 0; r < pos.size(); ++r)
    for (int grp = 0; grp < g; ++grp)
      for (int h = 0; h < hpg + 1; ++h)  // query heads and the key head; not the value head
        rotate_ref(x.data() + int64_t(r) * W + (int64_t(grp) * (hpg + 2) + h) * d, rc.rotary_dim,
                   pos[r], rc.base, rc.interleaved);
  return x;
}

struct RopeCase {
  int n, g, d, rot;
  bool interleaved;
  std::vector<int32_t> pos;
};

void rope_case(const RopeCase& c) {
  SCOPED_TRACE("n=" + std::to_string(c.n) + " g=" + std::to_string(c.g) + " d=" +
               std::to_string(c.d) + " rot=" + std::to_string(c.rot) +
               (c.interleaved ? " interleaved" : " halves"));
  const int64_t N = int64_t(c.pos.size()), W = int64_t(c.g) * (c.n / c.g + 2) * c.d;
  AttentionShape sh;
  sh.heads = c.n;
  sh.groups = c.g;
  sh.head_dim = c.d;
  RotaryConfig rc{c.rot, 500.0, c.interleaved};
  Tensor qkv = randn({N, W}, 201), positions = Tensor::from_vector(c.pos, {N});
  const std::vector<double> x = to_double(qkv);
  const std::vector<double> ref = rope_ref(x, c.pos, c.n, c.g, c.d, rc);
  Tensor y = qkv.clone();
  rope_fwd(y, positions, sh, rc);
  expect_close("rope_fwd", y, ref, 2e-6, 1e-5);
  // Backward: d(sum rope(x) * g)/dx by central differences (the op is linear in x).
  Tensor g = randn({N, W}, 202);
  const std::vector<double> gd = to_double(g);
  std::vector<double> gref(x.size()), xp = x;
  for (size_t k = 0; k < x.size(); ++k) {
    const double h = 1e-3;
    xp[k] = x[k] + h;
    const std::vector<double> up = rope_ref(xp, c.pos, c.n, c.g, c.d, rc);
    xp[k] = x[k] - h;
    const std::vector<double> dn = rope_ref(xp, c.pos, c.n, c.g, c.d, rc);
    xp[k] = x[k];
    double s = 0;
    for (size_t e = 0; e < up.size(); ++e) s += (up[e] - dn[e]) * gd[e];
    gref[k] = s / (2 * h);
  }
  rope_bwd(g, positions, sh, rc);
  expect_close("rope_bwd", g, gref, 2e-6, 1e-5);
}

TEST(Rope, HalvesAndInterleavedMatchMegatronFormulas) {
  const std::vector<int32_t> pos{0, 1, 2, 3, 0, 1, 2, 3};  // two sequences: the position table
  rope_case({4, 2, 6, 6, false, pos});                     // head_dim 6, GQA
  rope_case({4, 2, 6, 6, true, pos});
  rope_case({2, 2, 12, 6, false, {5, 9, 1000}});  // rotary_percent 0.5, scattered positions
  rope_case({2, 2, 12, 6, true, {5, 9, 1000}});
  rope_case({3, 1, 4, 2, false, {70000}});  // one row, MQA, a position beyond fp32 angles' reach
  rope_case({2, 1, 10, 8, true, {3, 2, 1}});
}

// A tensor-parallel rank's heads (whole query groups) rotate exactly like those columns of the
// full activation.
TEST(Rope, HeadSubsetMatchesFullRun) {
  const int n = 4, g = 2, d = 6, hpg = n / g;
  const int64_t N = 5, gw = int64_t(hpg + 2) * d, W = g * gw;
  Tensor qkv = randn({N, W}, 203);
  const std::vector<int32_t> pv{0, 1, 2, 3, 4};
  Tensor pos = Tensor::from_vector(pv, {N});
  AttentionShape full;
  full.heads = n;
  full.groups = g;
  full.head_dim = d;
  const RotaryConfig rc{d, 10000.0, false};
  Tensor all = qkv.clone();
  rope_fwd(all, pos, full, rc);
  AttentionShape part = full;
  part.heads = hpg;
  part.groups = 1;
  Tensor second = qkv.narrow(1, gw, gw).contiguous();
  rope_fwd(second, pos, part, rc);
  EXPECT_EQ(second.to_float_vector(), all.narrow(1, gw, gw).contiguous().to_float_vector());
}

TEST(Rope, RejectsBadArguments) {
  AttentionShape sh;
  sh.heads = 2;
  sh.groups = 1;
  sh.head_dim = 4;
  Tensor qkv = randn({3, 16}, 204);
  Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1, 2}, {3});
  EXPECT_THROW(rope_fwd(qkv, pos, sh, RotaryConfig{3, 1e4, false}), InternalError);  // odd
  EXPECT_THROW(rope_fwd(qkv, pos, sh, RotaryConfig{6, 1e4, false}), InternalError);  // > head_dim
  EXPECT_THROW(rope_fwd(qkv, pos, sh, RotaryConfig{0, 1e4, false}), InternalError);
  EXPECT_THROW(rope_fwd(qkv, Tensor::from_vector(std::vector<int32_t>{0, 1}, {2}), sh,
                        RotaryConfig{4, 1e4, false}),
               InternalError);  // one position per row
  EXPECT_THROW(rope_fwd(qkv, Tensor::from_vector(std::vector<int32_t>{0, -1, 2}, {3}), sh,
                        RotaryConfig{4, 1e4, false}),
               InternalError);
  EXPECT_THROW(rope_fwd(randn({3, 15}, 1), pos, sh, RotaryConfig{4, 1e4, false}), InternalError);
}

TEST(Alibi, SlopesFollowPressEtAl) {
  // Power of two: 2^(-8 (h+1) / n).
  const std::vector<float> s8 = alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(s8[size_t(h)], std::pow(2.0f, -float(h + 1)));
  // 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then slopes 1 and 3 (0-based 0, 2) of
  // the 8-head sequence: 2^-1, 2^-3.
  const std::vector<float> s6 = alibi_slopes(6);
  const std::vector<float> want6{0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
  EXPECT_EQ(s6, want6);
  // 12 heads: the 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (every other of 16 heads).
  const std::vector<float> s12 = alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(s12[size_t(8 + k)], std::pow(2.0f, -0.5f - float(k)));
  EXPECT_EQ(alibi_slopes(1), std::vector<float>{1.0f / 256});
  EXPECT_THROW(alibi_slopes(0), InternalError);
}

}  // namespace
}  // namespace megatron::ops
