// The core attention op computed in parts equals one run over the whole, which is what the model's
// parallel paths rely on: a tensor-parallel rank's query groups (head_offset / total_heads: ALiBi
// slopes and dropout masks by global head), context parallelism's zig-zag query rows against the
// gathered keys and values (all-gather), and the same rows against one packed key/value block at a
// time merged by attention_merge, with the backward accumulated block by block (the ring). Each
// under a causal mask with document starts and dropout, and under a bidirectional one with a
// window, ALiBi, key padding (by position) and dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace megatron::ops {
namespace {
using testing::randn;

constexpr int kHeads = 4, kGroups = 2, kDim = 3, kHpg = kHeads / kGroups;
constexpr int64_t kWidth = int64_t(kGroups) * (kHpg + 2) * kDim, kCtx = int64_t(kHeads) * kDim;
constexpr int64_t kKvWidth = int64_t(kGroups) * 2 * kDim;

int64_t q_col(int h) { return int64_t(h / kHpg) * (kHpg + 2) * kDim + int64_t(h % kHpg) * kDim; }
int64_t k_col(int g) { return int64_t(g) * (kHpg + 2) * kDim + int64_t(kHpg) * kDim; }

struct Masks {
  std::string what;
  AttentionMask mask;
  std::vector<int32_t> start;  // [b, S] by position (empty: none)
  std::vector<int32_t> pad;    // [b, S] (empty: none)
};

Masks causal_with_starts(int64_t b, int64_t S) {
  Masks m{"causal, starts", {}, {}, {}};
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < S; ++i) m.start.push_back(int32_t(i >= 5 + bi ? 5 + bi : 0));
  m.mask.attention_start = Tensor::from_vector(m.start, {b, S});
  return m;
}

Masks bidirectional_window_alibi_padding(int64_t b, int64_t S) {
  Masks m{"bidirectional, window, ALiBi, padding", {}, {}, {}};
  m.mask.causal = false;
  m.mask.window_left = 5;
  m.mask.window_right = 3;
  m.mask.alibi = true;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < S; ++i) m.pad.push_back(i % 7 == 3 + bi ? 0 : 1);
  m.mask.key_padding = Tensor::from_vector(m.pad, {b, S});
  return m;
}

AttentionInputs self_inputs(const Tensor& qkv, int64_t s) {
  AttentionInputs in;
  in.q = in.k = in.v = qkv;
  in.q_layout = HeadLayout::qkv(QkvPart::Query, kHeads, kGroups, kDim, s);
  in.k_layout = HeadLayout::qkv(QkvPart::Key, kHeads, kGroups, kDim, s);
  in.v_layout = HeadLayout::qkv(QkvPart::Value, kHeads, kGroups, kDim, s);
  return in;
}

// Rows `pos` of every sequence of a [b * S, w] matrix -> [b * pos.size(), w].
template <class T>
std::vector<T> rows_at(const std::vector<T>& m, int64_t b, int64_t S, int64_t w,
                       const std::vector<int32_t>& pos, int64_t col = 0, int64_t width = -1) {
  if (width < 0) width = w;
  std::vector<T> out;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int32_t p : pos)
      out.insert(out.end(), m.begin() + (bi * S + p) * w + col, m.begin() + (bi * S + p) * w + col + width);
  return out;
}

// The packed key/value columns of fused QKV rows [rows, kWidth] -> [rows, kKvWidth].
std::vector<float> packed_kv(const std::vector<float>& qkv) {
  std::vector<float> out;
  for (size_t row = 0; row < qkv.size() / size_t(kWidth); ++row)
    for (int g = 0; g < kGroups; ++g)
      out.insert(out.end(), qkv.begin() + int64_t(row) * kWidth + k_col(g),
                 qkv.begin() + int64_t(row) * kWidth + k_col(g) + 2 * kDim);
  return out;
}

// Zig-zag positions of CP rank r of C: chunks r and 2C-1-r of S / (2C).
std::vector<int32_t> zigzag(int64_t S, int64_t C, int64_t r) {
  std::vector<int32_t> pos;
  const int64_t cs = S / (2 * C);
  for (int64_t c : {r, 2 * C - 1 - r})
    for (int64_t i = 0; i < cs; ++i) pos.push_back(int32_t(c * cs + i));
  return pos;
}

struct Full {
  Tensor qkv, dout, out, lse, dqkv;
};

Full full_run(int64_t b, int64_t S, const Masks& m, const DropoutSpec& drop) {
  Full f{randn({b * S, kWidth}, 71), randn({b * S, kCtx}, 72), Tensor::empty({b * S, kCtx}, DType::F32),
         Tensor::empty({b, kHeads, S}, DType::F32), Tensor::empty({b * S, kWidth}, DType::F32)};
  const AttentionShape sh{b, S, kHeads, kGroups, kDim, 1.0f / std::sqrt(float(kDim))};
  attention_fwd(f.out, f.lse, Tensor(), self_inputs(f.qkv, S), m.mask, sh, drop);
  attention_bwd({f.dqkv, f.dqkv, f.dqkv, Tensor()}, f.dout, f.out, f.lse, Tensor(),
                self_inputs(f.qkv, S), m.mask, sh, drop);
  return f;
}

// One CP rank's view: its queries (fused QKV rows at its positions), their starts and dout.
struct RankPart {
  std::vector<int32_t> pos;
  Tensor q, dout;
  AttentionMask mask;
  AttentionShape shape;
};

RankPart rank_part(const Full& f, const Masks& m, int64_t b, int64_t S, int64_t C, int64_t r) {
  RankPart p;
  p.pos = zigzag(S, C, r);
  const int64_t sl = int64_t(p.pos.size());
  p.q = Tensor::from_vector(rows_at(f.qkv.to_float_vector(), b, S, kWidth, p.pos), {b * sl, kWidth});
  p.dout = Tensor::from_vector(rows_at(f.dout.to_float_vector(), b, S, kCtx, p.pos), {b * sl, kCtx});
  p.mask = m.mask;  // key padding stays [b, S] by position
  if (!m.start.empty())
    p.mask.attention_start = Tensor::from_vector(rows_at(m.start, b, S, 1, p.pos), {b, sl});
  p.shape = AttentionShape{b, sl, kHeads, kGroups, kDim, 1.0f / std::sqrt(float(kDim))};
  p.shape.kv_seq = p.shape.q_span = p.shape.kv_span = S;
  return p;
}

AttentionInputs rank_inputs(const RankPart& p, const Tensor& kv, int64_t kv_rows,
                            const std::vector<int32_t>& kv_pos) {
  AttentionInputs in;
  in.q = p.q;
  in.q_layout = HeadLayout::qkv(QkvPart::Query, kHeads, kGroups, kDim, p.shape.seq);
  in.k = in.v = kv;
  in.k_layout = HeadLayout::kv(QkvPart::Key, kGroups, kDim, kv_rows);
  in.v_layout = HeadLayout::kv(QkvPart::Value, kGroups, kDim, kv_rows);
  in.q_positions = Tensor::from_vector(p.pos, {p.shape.seq});
  if (!kv_pos.empty()) in.kv_positions = Tensor::from_vector(kv_pos, {kv_rows});
  return in;
}

// Rank rows of out / lse equal the full run's at their positions.
void expect_rows(const Full& f, const RankPart& p, const Tensor& out, const Tensor& lse, int64_t b,
                 int64_t S) {
  const int64_t sl = p.shape.seq;
  const std::vector<float> o = out.to_float_vector(), l = lse.to_float_vector();
  const std::vector<float> fo = f.out.to_float_vector(), fl = f.lse.to_float_vector();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < sl; ++i) {
      const int64_t pos = p.pos[size_t(i)];
      for (int64_t e = 0; e < kCtx; ++e)
        ASSERT_NEAR(o[size_t((bi * sl + i) * kCtx + e)], fo[size_t((bi * S + pos) * kCtx + e)], 1e-5)
            << "row " << pos;
      for (int h = 0; h < kHeads; ++h)
        ASSERT_NEAR(l[size_t((bi * kHeads + h) * sl + i)], fl[size_t((bi * kHeads + h) * S + pos)], 1e-5);
    }
}

// Adds a rank's dQ (query columns of dq [b*sl, kWidth]) and a dK/dV block (dkv [b*rows, kKvWidth]
// at kv positions) into the running dqkv sum [b*S, kWidth].
void add_grads(std::vector<float>& sum, const RankPart& p, const Tensor& dq, const Tensor& dkv,
               const std::vector<int32_t>& kv_pos, int64_t b, int64_t S) {
  const int64_t sl = p.shape.seq, kr = int64_t(kv_pos.size());
  const std::vector<float> q = dq.to_float_vector(), kv = dkv.to_float_vector();
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < sl; ++i)
      for (int h = 0; h < kHeads; ++h)
        for (int e = 0; e < kDim; ++e)
          sum[size_t((bi * S + p.pos[size_t(i)]) * kWidth + q_col(h) + e)] +=
              q[size_t((bi * sl + i) * kWidth + q_col(h) + e)];
    for (int64_t j = 0; j < kr; ++j)
      for (int g = 0; g < kGroups; ++g)
        for (int e = 0; e < 2 * kDim; ++e)
          sum[size_t((bi * S + kv_pos[size_t(j)]) * kWidth + k_col(g) + e)] +=
              kv[size_t((bi * kr + j) * kKvWidth + g * 2 * kDim + e)];
  }
}

void expect_sum(const std::vector<float>& sum, const Full& f) {
  const std::vector<float> want = f.dqkv.to_float_vector();
  for (size_t k = 0; k < want.size(); ++k) ASSERT_NEAR(sum[k], want[k], 2e-5) << k;
}

// --cp-comm-type allgather: each rank's queries against the whole sequence.
void query_subsets(int64_t S, const Masks& m) {
  SCOPED_TRACE(m.what + ", sequence " + std::to_string(S));
  const int64_t b = 2, C = 3;
  const DropoutSpec drop{0.3f, 5, 9};
  const Full f = full_run(b, S, m, drop);
  const Tensor kv = Tensor::from_vector(packed_kv(f.qkv.to_float_vector()), {b * S, kKvWidth});
  std::vector<int32_t> all;
  for (int32_t i = 0; i < S; ++i) all.push_back(i);
  for (bool save : {true, false}) {
    std::vector<float> sum(size_t(f.dqkv.numel()), 0.0f);
    for (int64_t r = 0; r < C; ++r) {
      const RankPart p = rank_part(f, m, b, S, C, r);
      const AttentionInputs in = rank_inputs(p, kv, S, {});
      Tensor out = Tensor::empty({p.q.size(0), kCtx}, DType::F32);
      Tensor lse = Tensor::empty({b, kHeads, p.shape.seq}, DType::F32);
      Tensor probs = save ? Tensor::empty({b, kHeads, p.shape.seq, S}, DType::F32) : Tensor();
      attention_fwd(out, lse, probs, in, p.mask, p.shape, drop);
      expect_rows(f, p, out, lse, b, S);
      Tensor dq = Tensor::zeros(p.q.shape(), DType::F32), dkv = Tensor::empty(kv.shape(), DType::F32);
      attention_bwd({dq, dkv, dkv, Tensor()}, p.dout, out, lse, probs, in, p.mask, p.shape, drop);
      add_grads(sum, p, dq, dkv, all, b, S);
    }
    expect_sum(sum, f);
  }
}

// --cp-comm-type p2p: each rank's queries against every rank's block, merged; backward block by
// block with the merged out and lse, accumulating dQ.
void ring_blocks(int64_t S, const Masks& m) {
  SCOPED_TRACE(m.what + ", sequence " + std::to_string(S));
  const int64_t b = 2, C = 3;
  const DropoutSpec drop{0.3f, 5, 9};
  const Full f = full_run(b, S, m, drop);
  const std::vector<float> x = f.qkv.to_float_vector();
  std::vector<float> sum(size_t(f.dqkv.numel()), 0.0f);
  for (int64_t r = 0; r < C; ++r) {
    const RankPart p = rank_part(f, m, b, S, C, r);
    const int64_t sl = p.shape.seq;
    AttentionShape block = p.shape;
    block.kv_seq = sl;
    Tensor out = Tensor::empty({b * sl, kCtx}, DType::F32), lse = Tensor::empty({b, kHeads, sl}, DType::F32);
    Tensor ob = Tensor::empty(out.shape(), DType::F32), lb = Tensor::empty(lse.shape(), DType::F32);
    for (int64_t i = 0; i < C; ++i) {
      const int64_t src = (r + C - i) % C;
      const std::vector<int32_t> kp = zigzag(S, C, src);
      const Tensor kv = Tensor::from_vector(packed_kv(rows_at(x, b, S, kWidth, kp)), {b * sl, kKvWidth});
      const AttentionInputs in = rank_inputs(p, kv, sl, kp);
      if (i == 0) {
        attention_fwd(out, lse, Tensor(), in, p.mask, block, drop);
      } else {
        attention_fwd(ob, lb, Tensor(), in, p.mask, block, drop);
        attention_merge(out, lse, ob, lb, block);
      }
    }
    expect_rows(f, p, out, lse, b, S);
    Tensor dq = Tensor::zeros(p.q.shape(), DType::F32);
    for (int64_t src = 0; src < C; ++src) {
      const std::vector<int32_t> kp = zigzag(S, C, src);
      const Tensor kv = Tensor::from_vector(packed_kv(rows_at(x, b, S, kWidth, kp)), {b * sl, kKvWidth});
      Tensor dkv = Tensor::zeros(kv.shape(), DType::F32);
      attention_bwd({dq, dkv, dkv, Tensor()}, p.dout, out, lse, Tensor(), rank_inputs(p, kv, sl, kp),
                    p.mask, block, drop, /*accumulate=*/true);
      add_grads(sum, p, Tensor::zeros(dq.shape(), DType::F32), dkv, kp, b, S);
    }
    add_grads(sum, p, dq, Tensor::zeros({0, kKvWidth}, DType::F32), {}, b, S);
  }
  expect_sum(sum, f);
}

TEST(AttentionParts, ZigZagQueryRowsAgainstTheWholeSequence) {
  query_subsets(12, causal_with_starts(2, 12));
  query_subsets(12, bidirectional_window_alibi_padding(2, 12));
  query_subsets(132, causal_with_starts(2, 132));  // the full run crosses the 64-row tiles
}

TEST(AttentionParts, RingBlocksMergedEqualTheWholeSequence) {
  ring_blocks(12, causal_with_starts(2, 12));
  ring_blocks(12, bidirectional_window_alibi_padding(2, 12));
  ring_blocks(132, causal_with_starts(2, 132));
  ring_blocks(132, bidirectional_window_alibi_padding(2, 132));
}

// Tensor parallelism: each query group run alone with its global head range gives exactly the
// full run's columns, ALiBi slopes and dropout masks included.
TEST(AttentionParts, HeadRangesEqualTheFullRun) {
  const int64_t b = 2, S = 9;
  const int gw = (kHpg + 2) * kDim;
  for (const Masks& m : {causal_with_starts(b, S), bidirectional_window_alibi_padding(b, S)}) {
    SCOPED_TRACE(m.what);
    const DropoutSpec drop{0.2f, 3, 4};
    const Full f = full_run(b, S, m, drop);
    auto cols = [&](const Tensor& t, int64_t first, int64_t width) {
      return t.narrow(1, first, width).contiguous();
    };
    for (int g0 = 0; g0 < kGroups; ++g0) {
      AttentionShape part{b, S, kHpg, 1, kDim, 1.0f / std::sqrt(float(kDim))};
      part.head_offset = g0 * kHpg;
      part.total_heads = kHeads;
      const int64_t c0 = int64_t(g0) * kHpg * kDim, cw = int64_t(kHpg) * kDim;
      const Tensor q = cols(f.qkv, g0 * gw, gw), dc = cols(f.dout, c0, cw);
      AttentionInputs in;
      in.q = in.k = in.v = q;
      in.q_layout = HeadLayout::qkv(QkvPart::Query, kHpg, 1, kDim, S);
      in.k_layout = HeadLayout::qkv(QkvPart::Key, kHpg, 1, kDim, S);
      in.v_layout = HeadLayout::qkv(QkvPart::Value, kHpg, 1, kDim, S);
      Tensor out = Tensor::empty(dc.shape(), DType::F32), lse = Tensor::empty({b, kHpg, S}, DType::F32);
      Tensor dq = Tensor::empty(q.shape(), DType::F32);
      attention_fwd(out, lse, Tensor(), in, m.mask, part, drop);
      attention_bwd({dq, dq, dq, Tensor()}, dc, out, lse, Tensor(), in, m.mask, part, drop);
      EXPECT_EQ(out.to_float_vector(), cols(f.out, c0, cw).to_float_vector());
      EXPECT_EQ(dq.to_float_vector(), cols(f.dqkv, g0 * gw, gw).to_float_vector());
    }
  }
}

}  // namespace
}  // namespace megatron::ops
