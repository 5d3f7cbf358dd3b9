// Attention masks beyond causal (bidirectional, sliding windows, key padding, ALiBi, combined
// with per-query starts and dropout) against a double reference that builds the mask from its
// definition per (query, key); the QKV gradient by central differences of that reference. Rows
// that see no key (all keys padded) get zeros, lse = -inf and no gradient. Also: tensor-parallel
// head subsets with ALiBi, long sequences across the 64-row tiles, and the context-parallel ops'
// rejection of these masks.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;

struct MaskCase {
  int64_t b, s;
  int n, g, d;
  bool causal = true;
  int64_t wl = -1, wr = -1;
  bool alibi = false;
  bool starts = false, padding = false;
  float p = 0.0f;
};

AttentionShape shape_of(const MaskCase& c) {
  AttentionShape sh{c.b, c.s, c.n, c.g, c.d, 1.0f / std::sqrt(float(c.d))};
  sh.causal = c.causal;
  sh.window_left = c.wl;
  sh.window_right = c.wr;
  sh.alibi = c.alibi;
  return sh;
}

bool visible(const MaskCase& c, const std::vector<int32_t>& start, const std::vector<int32_t>& pad,
             int64_t bi, int64_t i, int64_t j) {
  if (c.starts && j < start[size_t(bi * c.s + i)]) return false;
  if (c.causal && j > i) return false;
  if (c.wl >= 0 && j < i - c.wl) return false;
  if (!c.causal && c.wr >= 0 && j > i + c.wr) return false;
  if (c.padding && pad[size_t(bi * c.s + j)] == 0) return false;
  return true;
}

// ctx (double) for qkv (double); lse optional (-inf for rows that see no key).
std::vector<double> reference(const MaskCase& c, const std::vector<double>& qkv,
                              const std::vector<int32_t>& start, const std::vector<int32_t>& pad,
                              const DropoutSpec& d, std::vector<double>* lse) {
  const int hpg = c.n / c.g;
  const int64_t W = int64_t(c.g) * (hpg + 2) * c.d, CW = int64_t(c.n) * c.d;
  std::vector<double> out(size_t(c.b * c.s * CW), 0.0);
  if (lse) lse->assign(size_t(c.b * c.n * c.s), -INFINITY);
  const std::vector<float> slopes = alibi_slopes(c.n);
  const Philox rng(d.seed, d.stream);
  const double scale = 1.0 / std::sqrt(double(c.d));
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int h = 0; h < c.n; ++h) {
      const int grp = h / hpg;
      const int64_t qo = int64_t(grp) * (hpg + 2) * c.d + int64_t(h % hpg) * c.d;
      const int64_t ko = int64_t(grp) * (hpg + 2) * c.d + int64_t(hpg) * c.d, vo = ko + c.d;
      for (int64_t i = 0; i < c.s; ++i) {
        std::vector<double> sc(size_t(c.s), 0.0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.s; ++j) {
          if (!visible(c, start, pad, bi, i, j)) continue;
          double v = 0;
          for (int e = 0; e < c.d; ++e)
            v += qkv[size_t((bi * c.s + i) * W + qo + e)] * qkv[size_t((bi * c.s + j) * W + ko + e)];
          sc[size_t(j)] = v * scale + (c.alibi ? double(slopes[size_t(h)]) * double(j - i) : 0.0);
          mx = std::max(mx, sc[size_t(j)]);
        }
        if (mx == -INFINITY) continue;  // sees no key
        double se = 0;
        for (int64_t j = 0; j < c.s; ++j)
          if (visible(c, start, pad, bi, i, j)) se += std::exp(sc[size_t(j)] - mx);
        if (lse) (*lse)[size_t((bi * c.n + h) * c.s + i)] = mx + std::log(se);
        for (int64_t j = 0; j < c.s; ++j) {
          if (!visible(c, start, pad, bi, i, j)) continue;
          double pr = std::exp(sc[size_t(j)] - mx) / se;
          if (d.active()) {
            const uint64_t k = uint64_t(((bi * c.n + h) * c.s + i) * c.s + j);
            pr = rng.uniform(k) >= d.p ? pr / (1.0 - d.p) : 0.0;
          }
          for (int e = 0; e < c.d; ++e)
            out[size_t((bi * c.s + i) * CW + h * c.d + e)] += pr * qkv[size_t((bi * c.s + j) * W + vo + e)];
        }
      }
    }
  return out;
}

void run_case(const MaskCase& c, bool gradients = true) {
  const int hpg = c.n / c.g;
  const int64_t W = int64_t(c.g) * (hpg + 2) * c.d, CW = int64_t(c.n) * c.d;
  Tensor qkv = randn({c.b, c.s, W}, 301), dctx = randn({c.b, c.s, CW}, 302);
  std::vector<int32_t> start(size_t(c.b * c.s), 0), pad(size_t(c.b * c.s), 1);
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t i = 0; i < c.s; ++i) {
      if (c.starts) start[size_t(bi * c.s + i)] = int32_t(i >= 3 + bi ? 3 + bi : 0);
      // Batch 0: the last two keys are padding; batch 1 (when there): every key is padding.
      if (c.padding) pad[size_t(bi * c.s + i)] = bi == 0 ? (i < c.s - 2 ? 1 : 0) : 0;
    }
  Tensor st = c.starts ? Tensor::from_vector(start, {c.b, c.s}) : Tensor();
  Tensor kp = c.padding ? Tensor::from_vector(pad, {c.b, c.s}) : Tensor();
  const AttentionShape sh = shape_of(c);
  const DropoutSpec drop{c.p, 5, 9};
  std::vector<double> q = testing::to_double(qkv), lse_ref;
  const std::vector<double> ref = reference(c, q, start, pad, drop, &lse_ref);
  std::vector<double> gref(q.size());
  if (gradients) {
    const std::vector<double> dc = testing::to_double(dctx);
    for (size_t k = 0; k < q.size(); ++k) {
      const double h = 1e-6, orig = q[k];
      q[k] = orig + h;
      const std::vector<double> up = reference(c, q, start, pad, drop, nullptr);
      q[k] = orig - h;
      const std::vector<double> dn = reference(c, q, start, pad, drop, nullptr);
      q[k] = orig;
      double s = 0;
      for (size_t e = 0; e < up.size(); ++e) s += (up[e] - dn[e]) * dc[e];
      gref[k] = s / (2 * h);
    }
  }
  for (bool save_probs : {true, false}) {
    SCOPED_TRACE(save_probs ? "saved probs" : "recomputed probs");
    Tensor ctx = Tensor::full({c.b, c.s, CW}, 5.0, DType::F32);  // must be fully written
    Tensor lse = Tensor::empty({c.b, c.n, c.s}, DType::F32);
    Tensor probs = save_probs ? Tensor::full({c.b, c.n, c.s, c.s}, 3.0, DType::F32) : Tensor();
    attention_fwd(ctx, lse, probs, qkv, st, sh, drop, kp);
    expect_close("ctx", ctx, ref, 1e-5);
    expect_close("lse", lse, lse_ref, 1e-5);
    if (save_probs) {  // rows sum to 1 over visible keys, exactly 0 elsewhere
      const std::vector<float> pv = probs.to_float_vector();
      for (int64_t bi = 0; bi < c.b; ++bi)
        for (int h = 0; h < c.n; ++h)
          for (int64_t i = 0; i < c.s; ++i) {
            double sum = 0;
            bool any = false;
            for (int64_t j = 0; j < c.s; ++j) {
              const float v = pv[size_t(((bi * c.n + h) * c.s + i) * c.s + j)];
              if (visible(c, start, pad, bi, i, j)) {
                any = true;
                sum += v;
              } else {
                ASSERT_EQ(v, 0.0f) << "b" << bi << " h" << h << " i" << i << " j" << j;
              }
            }
            EXPECT_NEAR(sum, any ? 1.0 : 0.0, 1e-5);
          }
    }
    if (!gradients) continue;
    Tensor dqkv = Tensor::full(qkv.shape(), 123.0, DType::F32);  // must be fully written
    attention_bwd(dqkv, dctx, qkv, lse, probs, st, sh, drop, kp);
    expect_close("dqkv", dqkv, gref, 2e-5, 1e-4);
  }
}

TEST(AttentionMasks, Bidirectional) { run_case({2, 7, 4, 2, 3, false}); }
TEST(AttentionMasks, BidirectionalWindowBothSides) { run_case({1, 9, 2, 1, 4, false, 2, 1}); }
TEST(AttentionMasks, BidirectionalLeftWindowOnly) { run_case({1, 8, 2, 2, 3, false, 3, -1}); }
TEST(AttentionMasks, CausalSlidingWindowWithStarts) {
  MaskCase c{2, 10, 2, 1, 5, true, 2};
  c.starts = true;
  run_case(c);
}
TEST(AttentionMasks, CausalWindowZeroSeesItself) { run_case({1, 5, 1, 1, 3, true, 0}); }
TEST(AttentionMasks, AlibiCausalAndBidirectional) {
  MaskCase c{1, 8, 6, 3, 3};  // 6 heads: the interleaved (non power of two) slopes
  c.alibi = true;
  run_case(c);
  c.causal = false;
  run_case(c);
}
TEST(AttentionMasks, KeyPaddingWithFullyPaddedSequence) {
  MaskCase c{2, 6, 2, 1, 3, false};
  c.padding = true;
  run_case(c);
  c.causal = true;  // causal + padding: batch 0's rows still see keys
  run_case(c);
}
TEST(AttentionMasks, DropoutBidirectionalWindowPaddingAlibi) {
  MaskCase c{2, 7, 2, 2, 2, false, 2, 3};
  c.alibi = true;
  c.padding = true;
  c.p = 0.3f;
  run_case(c);
}
// Longer than the 64-row tiles: windowed tiles start at their first visible key.
TEST(AttentionMasks, LongSequencesAcrossTiles) {
  MaskCase causal_window{1, 100, 1, 1, 2, true, 20};
  causal_window.p = 0.2f;
  causal_window.starts = true;
  run_case(causal_window);
  MaskCase bidir{1, 100, 1, 1, 2, false, 50, 5};
  bidir.alibi = true;
  bidir.padding = true;
  run_case(bidir);
}

// Tensor parallelism: query groups run alone with head_offset / total_heads give the full run's
// columns, ALiBi slopes and dropout masks included (both indexed by the global head).
TEST(AttentionMasks, HeadSubsetMatchesFullRunWithAlibi) {
  const int64_t b = 1, s = 9;
  const int n = 6, g = 3, d = 2, hpg = n / g;
  const int64_t gw = int64_t(hpg + 2) * d, W = g * gw;
  Tensor qkv = randn({b, s, W}, 311), dctx = randn({b, s, int64_t(n) * d}, 312);
  AttentionShape full{b, s, n, g, d, 1.0f / std::sqrt(float(d))};
  full.alibi = true;
  full.causal = false;
  full.window_left = 4;
  const DropoutSpec drop{0.2f, 3, 4};
  Tensor ctx = Tensor::empty({b, s, int64_t(n) * d}, DType::F32), lse = Tensor::empty({b, n, s}, DType::F32);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
  attention_fwd(ctx, lse, Tensor(), qkv, Tensor(), full, drop);
  attention_bwd(dqkv, dctx, qkv, lse, Tensor(), Tensor(), full, drop);
  auto cols = [&](const Tensor& t, int64_t first, int64_t width) {
    return t.view({b * s, -1}).narrow(1, first, width).contiguous();
  };
  for (int g0 = 0; g0 < g; ++g0) {
    AttentionShape part = full;
    part.heads = hpg;
    part.groups = 1;
    part.head_offset = g0 * hpg;
    part.total_heads = n;
    const int64_t c0 = int64_t(g0) * hpg * d, cw = int64_t(hpg) * d;
    Tensor q = cols(qkv, g0 * gw, gw), dc = cols(dctx, c0, cw);
    Tensor c = Tensor::empty(dc.shape(), DType::F32), l = Tensor::empty({b, hpg, s}, DType::F32);
    Tensor dq = Tensor::empty(q.shape(), DType::F32);
    attention_fwd(c, l, Tensor(), q, Tensor(), part, drop);
    attention_bwd(dq, dc, q, l, Tensor(), Tensor(), part, drop);
    EXPECT_EQ(c.to_float_vector(), cols(ctx, c0, cw).to_float_vector());
    EXPECT_EQ(dq.to_float_vector(), cols(dqkv, g0 * gw, gw).to_float_vector());
  }
}

TEST(AttentionMasks, RejectsInconsistentMasks) {
  AttentionShape sh{1, 4, 1, 1, 2, 1.0f};
  Tensor qkv = randn({1, 4, 6}, 321), ctx = Tensor::empty({1, 4, 2}, DType::F32);
  Tensor lse = Tensor::empty({1, 1, 4}, DType::F32);
  AttentionShape bad = sh;
  bad.window_right = 2;  // needs bidirectional attention
  EXPECT_THROW(attention_fwd(ctx, lse, Tensor(), qkv, Tensor(), bad, DropoutSpec{}), InternalError);
  bad = sh;
  bad.window_left = -3;
  EXPECT_THROW(attention_fwd(ctx, lse, Tensor(), qkv, Tensor(), bad, DropoutSpec{}), InternalError);
  EXPECT_THROW(attention_fwd(ctx, lse, Tensor(), qkv, Tensor(), sh, DropoutSpec{},
                             Tensor::from_vector(std::vector<int32_t>{1, 1, 1}, {1, 3})),
               InternalError);  // key_padding [b, s]
  AttentionShape causal_zero = sh;
  causal_zero.window_right = 0;  // what causal means: accepted
  EXPECT_NO_THROW(attention_fwd(ctx, lse, Tensor(), qkv, Tensor(), causal_zero, DropoutSpec{}));
}

// Context parallelism (subset and ring block ops) implements the causal mask only.
TEST(AttentionMasks, ContextParallelOpsRejectOtherMasks) {
  for (int which = 0; which < 3; ++which) {
    AttentionShape sh{1, 2, 1, 1, 2, 1.0f};
    sh.kv_seq = 4;
    if (which == 0) sh.causal = false;
    if (which == 1) sh.window_left = 1;
    if (which == 2) sh.alibi = true;
    Tensor qkv = randn({1, 4, 6}, 331), ctx = Tensor::empty({1, 2, 2}, DType::F32);
    Tensor lse = Tensor::empty({1, 1, 2}, DType::F32);
    const Tensor qpos = Tensor::from_vector(std::vector<int32_t>{1, 3}, {2});
    EXPECT_THROW(attention_subset_fwd(ctx, lse, Tensor(), qkv, qpos, Tensor(), sh, DropoutSpec{}),
                 Error);
    EXPECT_THROW(attention_subset_bwd(Tensor::empty({1, 4, 6}, DType::F32), ctx, qkv, qpos, lse,
                                      Tensor(), Tensor(), sh, DropoutSpec{}),
                 Error);
    sh.full_seq = 4;
    sh.kv_seq = 2;
    Tensor q = randn({1, 2, 6}, 332), kv = randn({1, 2, 4}, 333);
    EXPECT_THROW(attention_block_fwd(ctx, lse, q, qpos, kv, qpos, Tensor(), sh, DropoutSpec{}),
                 Error);
  }
}

}  // namespace
}  // namespace megatron::ops
