// Fused causal attention against a double-precision reference: forward output and log-sum-exp,
// and the QKV gradient by central differences of the double forward (so the check does not
// share the kernel's backward formulas). Covers grouped query heads, per-query attention starts
// (--reset-attention-mask), Philox dropout, and saved vs recomputed probabilities.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;

struct Case {
  int64_t b, s;
  int n, g, d;
  float p;
  bool starts;
};

// ctx (double) for qkv (double); lse optional.
std::vector<double> reference(const Case& c, const std::vector<double>& qkv,
                              const std::vector<int32_t>& start, const DropoutSpec& d,
                              std::vector<double>* lse) {
  const int hpg = c.n / c.g;
  const int64_t W = int64_t(c.g) * (hpg + 2) * c.d, CW = int64_t(c.n) * c.d;
  std::vector<double> out(size_t(c.b * c.s * CW), 0.0);
  if (lse) lse->assign(size_t(c.b * c.n * c.s), 0.0);
  const Philox rng(d.seed, d.stream);
  const double scale = 1.0 / std::sqrt(double(c.d));
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int h = 0; h < c.n; ++h) {
      const int grp = h / hpg;
      const int64_t qo = int64_t(grp) * (hpg + 2) * c.d + int64_t(h % hpg) * c.d;
      const int64_t ko = int64_t(grp) * (hpg + 2) * c.d + int64_t(hpg) * c.d, vo = ko + c.d;
      for (int64_t i = 0; i < c.s; ++i) {
        const int64_t j0 = c.starts ? start[size_t(bi * c.s + i)] : 0;
        std::vector<double> sc(size_t(c.s), 0.0);
        double mx = -1e300;
        for (int64_t j = j0; j <= i; ++j) {
          double v = 0;
          for (int e = 0; e < c.d; ++e)
            v += qkv[size_t((bi * c.s + i) * W + qo + e)] * qkv[size_t((bi * c.s + j) * W + ko + e)];
          sc[size_t(j)] = v * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double se = 0;
        for (int64_t j = j0; j <= i; ++j) se += std::exp(sc[size_t(j)] - mx);
        if (lse) (*lse)[size_t((bi * c.n + h) * c.s + i)] = mx + std::log(se);
        for (int64_t j = j0; j <= i; ++j) {
          double pr = std::exp(sc[size_t(j)] - mx) / se;
          if (d.active()) {
            const uint64_t k = uint64_t(((bi * c.n + h) * c.s + i) * c.s + j);
            pr = rng.uniform(k) >= d.p ? pr / (1.0 - d.p) : 0.0;
          }
          for (int e = 0; e < c.d; ++e)
            out[size_t((bi * c.s + i) * CW + h * c.d + e)] +=
                pr * qkv[size_t((bi * c.s + j) * W + vo + e)];
        }
      }
    }
  return out;
}

void run_case(const Case& c) {
  const int hpg = c.n / c.g;
  const int64_t W = int64_t(c.g) * (hpg + 2) * c.d, CW = int64_t(c.n) * c.d;
  Tensor qkv = randn({c.b, c.s, W}, 31);
  Tensor dctx = randn({c.b, c.s, CW}, 32);
  std::vector<int32_t> start(size_t(c.b * c.s), 0);
  if (c.starts)
    for (int64_t bi = 0; bi < c.b; ++bi)
      for (int64_t i = 0; i < c.s; ++i) start[size_t(bi * c.s + i)] = int32_t(i >= 3 + bi ? 3 + bi : 0);
  Tensor st = c.starts ? Tensor::from_vector(start, {c.b, c.s}) : Tensor();
  AttentionShape sh{c.b, c.s, c.n, c.g, c.d, 1.0f / std::sqrt(float(c.d))};
  DropoutSpec drop{c.p, 5, 9};
  std::vector<double> q = testing::to_double(qkv), lse_ref;
  std::vector<double> ref = reference(c, q, start, drop, &lse_ref);

  // d(sum ctx * dctx)/dqkv by central differences in double.
  std::vector<double> gref(q.size()), dc = testing::to_double(dctx);
  for (size_t k = 0; k < q.size(); ++k) {
    const double h = 1e-6, orig = q[k];
    q[k] = orig + h;
    std::vector<double> up = reference(c, q, start, drop, nullptr);
    q[k] = orig - h;
    std::vector<double> dn = reference(c, q, start, drop, nullptr);
    q[k] = orig;
    double s = 0;
    for (size_t e = 0; e < up.size(); ++e) s += (up[e] - dn[e]) * dc[e];
    gref[k] = s / (2 * h);
  }
  for (bool save_probs : {true, false}) {
    SCOPED_TRACE(save_probs ? "saved probs" : "recomputed probs");
    Tensor ctx = Tensor::empty({c.b, c.s, CW}, DType::F32);
    Tensor lse = Tensor::empty({c.b, c.n, c.s}, DType::F32);
    Tensor probs = save_probs ? Tensor::empty({c.b, c.n, c.s, c.s}, DType::F32) : Tensor();
    attention_fwd(ctx, lse, probs, qkv, st, sh, drop);
    expect_close("attention ctx", ctx, ref, 1e-5);
    expect_close("attention lse", lse, lse_ref, 1e-5);
    Tensor dqkv = Tensor::full(qkv.shape(), 123.0, DType::F32);  // must be fully overwritten
    attention_bwd(dqkv, dctx, qkv, lse, probs, st, sh, drop);
    expect_close("attention dqkv", dqkv, gref, 2e-5, 1e-4);
  }
}

// Tensor parallelism: the heads of query groups [g0, g0 + gl) run alone (their QKV columns, with
// head_offset / total_heads set) give exactly the full run's output columns and gradients,
// dropout included, because masks are indexed by the global head.
TEST(Attention, HeadSubsetMatchesFullRunWithDropout) {
  const int64_t b = 2, s = 7;
  const int n = 4, g = 2, d = 3, hpg = n / g, gl = 1;
  const int64_t gw = int64_t(hpg + 2) * d, W = g * gw;
  Tensor qkv = randn({b, s, W}, 51), dctx = randn({b, s, int64_t(n) * d}, 52);
  const DropoutSpec drop{0.3f, 5, 9};
  AttentionShape full{b, s, n, g, d, 1.0f / std::sqrt(float(d))};
  Tensor ctx = Tensor::empty({b, s, int64_t(n) * d}, DType::F32);
  Tensor lse = Tensor::empty({b, n, s}, DType::F32), dqkv = Tensor::empty(qkv.shape(), DType::F32);
  attention_fwd(ctx, lse, Tensor(), qkv, Tensor(), full, drop);
  attention_bwd(dqkv, dctx, qkv, lse, Tensor(), Tensor(), full, drop);
  for (int g0 = 0; g0 < g; g0 += gl) {
    AttentionShape part = full;
    part.heads = gl * hpg;
    part.groups = gl;
    part.head_offset = g0 * hpg;
    part.total_heads = n;
    auto cols = [&](const Tensor& t, int64_t first, int64_t width) {
      return t.view({b * s, -1}).narrow(1, first, width).contiguous();
    };
    const int64_t c0 = int64_t(g0) * hpg * d, cw = int64_t(gl) * hpg * d;
    Tensor q = cols(qkv, g0 * gw, gl * gw), dc = cols(dctx, c0, cw);
    Tensor c = Tensor::empty(dc.shape(), DType::F32);
    Tensor l = Tensor::empty({b, gl * hpg, s}, DType::F32);
    Tensor dq = Tensor::empty(q.shape(), DType::F32);
    attention_fwd(c, l, Tensor(), q, Tensor(), part, drop);
    attention_bwd(dq, dc, q, l, Tensor(), Tensor(), part, drop);
    EXPECT_EQ(c.to_float_vector(), cols(ctx, c0, cw).to_float_vector());
    EXPECT_EQ(dq.to_float_vector(), cols(dqkv, g0 * gw, gl * gw).to_float_vector());
  }
}

// Context parallelism: disjoint query subsets of a sequence (the zig-zag halves of 2 ranks: chunks
// {0, 3} and {1, 2} of 4) against the whole sequence give the full run's rows of ctx and lse, and
// their dqkv summed give the full dqkv; with GQA, per-query starts and dropout, saved or
// recomputed probabilities.
TEST(Attention, QuerySubsetsMatchTheFullRun) {
  const int64_t b = 2, s = 8, cs = 2;
  const int n = 4, g = 2, d = 3, hpg = n / g;
  const int64_t W = int64_t(g) * (hpg + 2) * d, CW = int64_t(n) * d;
  Tensor qkv = randn({b, s, W}, 61), dctx = randn({b, s, CW}, 62);
  std::vector<int32_t> start(size_t(b * s));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < s; ++i) start[size_t(bi * s + i)] = int32_t(i >= 3 + bi ? 3 + bi : 0);
  Tensor st = Tensor::from_vector(start, {b, s});
  const DropoutSpec drop{0.3f, 5, 9};
  AttentionShape full{b, s, n, g, d, 1.0f / std::sqrt(float(d))};
  Tensor ctx = Tensor::empty({b, s, CW}, DType::F32), lse = Tensor::empty({b, n, s}, DType::F32);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
  attention_fwd(ctx, lse, Tensor(), qkv, st, full, drop);
  attention_bwd(dqkv, dctx, qkv, lse, Tensor(), st, full, drop);
  for (bool save_probs : {true, false}) {
    SCOPED_TRACE(save_probs ? "saved probs" : "recomputed probs");
    std::vector<float> dsum(size_t(dqkv.numel()), 0.0f);
    for (const std::vector<int32_t>& chunks : {std::vector<int32_t>{0, 3}, {1, 2}}) {
      std::vector<int32_t> pos;
      for (int32_t c : chunks)
        for (int64_t i = 0; i < cs; ++i) pos.push_back(int32_t(c * cs + i));
      const int64_t sq = int64_t(pos.size());
      std::vector<int32_t> sst;
      std::vector<float> dcs;
      const std::vector<float> dcf = dctx.to_float_vector();
      for (int64_t bi = 0; bi < b; ++bi)
        for (int32_t p : pos) {
          sst.push_back(start[size_t(bi * s + p)]);
          dcs.insert(dcs.end(), dcf.begin() + (bi * s + p) * CW, dcf.begin() + (bi * s + p + 1) * CW);
        }
      AttentionShape part = full;
      part.seq = sq;
      part.kv_seq = s;
      Tensor qp = Tensor::from_vector(pos, {sq});
      Tensor c = Tensor::empty({b, sq, CW}, DType::F32), l = Tensor::empty({b, n, sq}, DType::F32);
      Tensor probs = save_probs ? Tensor::empty({b, n, sq, s}, DType::F32) : Tensor();
      Tensor sub_st = Tensor::from_vector(sst, {b, sq}), dc = Tensor::from_vector(dcs, {b, sq, CW});
      attention_subset_fwd(c, l, probs, qkv, qp, sub_st, part, drop);
      Tensor dq = Tensor::full(qkv.shape(), 123.0, DType::F32);  // must be fully overwritten
      attention_subset_bwd(dq, dc, qkv, qp, l, probs, sub_st, part, drop);
      const std::vector<float> cv = c.to_float_vector(), lv = l.to_float_vector();
      const std::vector<float> cf = ctx.to_float_vector(), lf = lse.to_float_vector();
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t i = 0; i < sq; ++i) {
          const int64_t p = pos[size_t(i)];
          for (int64_t e = 0; e < CW; ++e)
            EXPECT_NEAR(cv[size_t((bi * sq + i) * CW + e)], cf[size_t((bi * s + p) * CW + e)], 1e-6);
          for (int h = 0; h < n; ++h)
            EXPECT_NEAR(lv[size_t((bi * n + h) * sq + i)], lf[size_t((bi * n + h) * s + p)], 1e-6);
        }
      const std::vector<float> dv = dq.to_float_vector();
      for (size_t k = 0; k < dv.size(); ++k) dsum[k] += dv[k];
    }
    const std::vector<float> want = dqkv.to_float_vector();
    for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(dsum[k], want[k], 1e-5) << k;
  }
}

// The ring variant of context parallelism: each of C = 3 zig-zag ranks (chunks r and 5-r of 6)
// runs its queries against every rank's packed key/value block and merges the partial softmaxes;
// ctx and lse equal the full run's rows, and the blocks' dQ / dK / dV, put back at their
// positions and summed, equal the full dqkv. With GQA, per-query starts and dropout.
void ring_case(int64_t s) {
  SCOPED_TRACE("sequence " + std::to_string(s));
  const int64_t b = 2, C = 3, cs = s / (2 * C), sl = s / C;
  const int n = 4, g = 2, d = 3, hpg = n / g;
  const int64_t W = int64_t(g) * (hpg + 2) * d, CW = int64_t(n) * d, KW = int64_t(g) * 2 * d;
  Tensor qkv = randn({b, s, W}, 71), dctx = randn({b, s, CW}, 72);
  std::vector<int32_t> start(size_t(b * s));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < s; ++i) start[size_t(bi * s + i)] = int32_t(i >= 5 + bi ? 5 + bi : 0);
  const DropoutSpec drop{0.3f, 5, 9};
  AttentionShape full{b, s, n, g, d, 1.0f / std::sqrt(float(d))};
  Tensor ctx = Tensor::empty({b, s, CW}, DType::F32), lse = Tensor::empty({b, n, s}, DType::F32);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
  Tensor st = Tensor::from_vector(start, {b, s});
  attention_fwd(ctx, lse, Tensor(), qkv, st, full, drop);
  attention_bwd(dqkv, dctx, qkv, lse, Tensor(), st, full, drop);
  const std::vector<float> x = qkv.to_float_vector(), dcf = dctx.to_float_vector();
  auto positions = [&](int64_t r) {
    std::vector<int32_t> pos;
    for (int64_t c : {r, 2 * C - 1 - r})
      for (int64_t i = 0; i < cs; ++i) pos.push_back(int32_t(c * cs + i));
    return pos;
  };
  // Rows of a [b, s, w] tensor at the given positions -> [b, sl, w]; kv packs columns per group.
  auto rows = [&](const std::vector<float>& src, int64_t w, const std::vector<int32_t>& pos) {
    std::vector<float> out;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int32_t p : pos) out.insert(out.end(), src.begin() + (bi * s + p) * w, src.begin() + (bi * s + p + 1) * w);
    return out;
  };
  auto packed_kv = [&](const std::vector<int32_t>& pos) {
    std::vector<float> out;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int32_t p : pos)
        for (int grp = 0; grp < g; ++grp) {
          const float* k = x.data() + (bi * s + p) * W + int64_t(grp) * (hpg + 2) * d + hpg * d;
          out.insert(out.end(), k, k + 2 * d);
        }
    return out;
  };
  std::vector<float> dsum(size_t(dqkv.numel()), 0.0f);
  const std::vector<float> cf = ctx.to_float_vector(), lf = lse.to_float_vector();
  for (int64_t r = 0; r < C; ++r) {
    const std::vector<int32_t> qp = positions(r);
    std::vector<int32_t> sst;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int32_t p : qp) sst.push_back(start[size_t(bi * s + p)]);
    AttentionShape part = full;
    part.seq = sl;
    part.kv_seq = sl;
    part.full_seq = s;
    Tensor q = Tensor::from_vector(rows(x, W, qp), {b, sl, W});
    Tensor qpos = Tensor::from_vector(qp, {sl}), sub_st = Tensor::from_vector(sst, {b, sl});
    Tensor c = Tensor::zeros({b, sl, CW}, DType::F32);
    Tensor l = Tensor::full({b, n, sl}, -INFINITY, DType::F32);
    for (int64_t src = 0; src < C; ++src) {
      Tensor kv = Tensor::from_vector(packed_kv(positions(src)), {b, sl, KW});
      Tensor kpos = Tensor::from_vector(positions(src), {sl});
      Tensor cb = Tensor::empty({b, sl, CW}, DType::F32), lb = Tensor::empty({b, n, sl}, DType::F32);
      attention_block_fwd(cb, lb, q, qpos, kv, kpos, sub_st, part, drop);
      attention_merge(c, l, cb, lb, part);
    }
    const std::vector<float> cv = c.to_float_vector(), lv = l.to_float_vector();
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < sl; ++i) {
        const int64_t p = qp[size_t(i)];
        for (int64_t e = 0; e < CW; ++e)
          EXPECT_NEAR(cv[size_t((bi * sl + i) * CW + e)], cf[size_t((bi * s + p) * CW + e)], 1e-5);
        for (int h = 0; h < n; ++h)
          EXPECT_NEAR(lv[size_t((bi * n + h) * sl + i)], lf[size_t((bi * n + h) * s + p)], 1e-5);
      }
    Tensor dc = Tensor::from_vector(rows(dcf, CW, qp), {b, sl, CW});
    Tensor delta = Tensor::empty({b, n, sl}, DType::F32);
    attention_delta(delta, dc, c, part);
    Tensor dq = Tensor::zeros({b, sl, W}, DType::F32);
    for (int64_t src = 0; src < C; ++src) {
      const std::vector<int32_t> kp = positions(src);
      Tensor kv = Tensor::from_vector(packed_kv(kp), {b, sl, KW});
      Tensor dkv = Tensor::zeros({b, sl, KW}, DType::F32);
      attention_block_bwd(dq, dkv, dc, q, qpos, kv, Tensor::from_vector(kp, {sl}), l, delta,
                          sub_st, part, drop);
      const std::vector<float> dk = dkv.to_float_vector();
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t j = 0; j < sl; ++j)
          for (int grp = 0; grp < g; ++grp)
            for (int64_t e = 0; e < 2 * d; ++e)
              dsum[size_t((bi * s + kp[size_t(j)]) * W + int64_t(grp) * (hpg + 2) * d + hpg * d + e)] +=
                  dk[size_t((bi * sl + j) * KW + grp * 2 * d + e)];
    }
    const std::vector<float> dqv = dq.to_float_vector();
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < sl; ++i)
        for (int h = 0; h < n; ++h)
          for (int64_t e = 0; e < d; ++e) {
            const int64_t col = int64_t(h / hpg) * (hpg + 2) * d + int64_t(h % hpg) * d + e;
            dsum[size_t((bi * s + qp[size_t(i)]) * W + col)] += dqv[size_t((bi * sl + i) * W + col)];
          }
  }
  const std::vector<float> want = dqkv.to_float_vector();
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(dsum[k], want[k], 1e-5) << k;
}

// 132 tokens: the full run crosses the causal kernel's 64-row tiles.
TEST(Attention, RingBlocksMergedMatchTheFullRun) {
  ring_case(12);
  ring_case(132);
}

TEST(Attention, BlockOpsRejectBadPositions) {
  AttentionShape sh{1, 2, 1, 1, 2, 1.0f};
  sh.kv_seq = 2;
  sh.full_seq = 4;
  Tensor q = Tensor::zeros({1, 2, 6}, DType::F32), kv = Tensor::zeros({1, 2, 4}, DType::F32);
  Tensor c = Tensor::empty({1, 2, 2}, DType::F32), l = Tensor::empty({1, 1, 2}, DType::F32);
  const Tensor ok = Tensor::from_vector(std::vector<int32_t>{0, 3}, {2});
  const Tensor descending = Tensor::from_vector(std::vector<int32_t>{3, 0}, {2});
  const Tensor outside = Tensor::from_vector(std::vector<int32_t>{0, 4}, {2});
  EXPECT_NO_THROW(attention_block_fwd(c, l, q, ok, kv, ok, Tensor(), sh, DropoutSpec{}));
  EXPECT_THROW(attention_block_fwd(c, l, q, descending, kv, ok, Tensor(), sh, DropoutSpec{}), InternalError);
  EXPECT_THROW(attention_block_fwd(c, l, q, ok, kv, outside, Tensor(), sh, DropoutSpec{}), InternalError);
  EXPECT_THROW(attention_block_fwd(c, l, q, ok, Tensor::zeros({1, 2, 6}, DType::F32), ok, Tensor(),
                                   sh, DropoutSpec{}), InternalError);
}

TEST(Attention, PlainCausal) { run_case({2, 9, 2, 2, 4, 0.0f, false}); }
TEST(Attention, GroupedQueryWithStarts) { run_case({2, 8, 4, 2, 3, 0.0f, true}); }
TEST(Attention, DropoutWithStartsSingleGroup) { run_case({1, 10, 3, 1, 4, 0.3f, true}); }
// Longer than the 64-row tiles the kernel splits the causal square into (3 tiles, the last short).
TEST(Attention, LongSequenceAcrossRowTiles) { run_case({1, 150, 2, 1, 2, 0.2f, true}); }

}  // namespace
}  // namespace megatron::ops
