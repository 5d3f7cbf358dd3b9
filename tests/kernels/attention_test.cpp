// The core attention op against the float64 reference of attention_reference.h: output,
// log-sum-exp and saved probabilities, and dq, dk, dv, dbias, both against the analytic reference
// and (in the small cases) against central differences of the reference forward. Every mask kind
// (causal, bidirectional, sliding windows on either side, key padding with a fully padded
// sequence, --reset-attention-mask starts, ALiBi), with and without a bias (per batch row and
// broadcast), queries and keys of different lengths through each operand layout (fused QKV, a
// separate Q with a fused KV, fused-QKV queries with a packed KV block), GQA and MQA, positions
// (a subset of the query rows, a block of key rows, the spans of a larger attention), a
// tensor-parallel head range, dropout, the KV-cache form (kv_index), long sequences across the
// 64-row tiles and 512-key blocks, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "attention_case.h"
#include "attention_reference.h"
#include "core/error.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::RefAttention;
using testing::RefValues;

using testing::AttentionCase;
using testing::Operands;
using Case = AttentionCase;

std::vector<double> random_values(size_t n, uint64_t stream) {
  Tensor t = testing::randn({int64_t(n)}, stream);
  return testing::to_double(t);
}

// The reference description and operand values of a case.
using Built = testing::ReferenceCase;

Built build(const Case& c) { return testing::reference_case(c, random_values, 31); }

// Columns of query head h, key and value head grp in the operand tensors of a layout.
struct Columns {
  int n, g, d;
  Operands operands;
  int hpg() const { return n / g; }
  int64_t q_width() const {
    return operands == Operands::SeparateQFusedKv ? int64_t(n) * d : int64_t(g) * (hpg() + 2) * d;
  }
  int64_t kv_width() const {
    return operands == Operands::FusedQkv ? q_width() : int64_t(g) * 2 * d;
  }
  int64_t q(int h) const {
    return operands == Operands::SeparateQFusedKv
               ? int64_t(h) * d
               : int64_t(h / hpg()) * (hpg() + 2) * d + int64_t(h % hpg()) * d;
  }
  int64_t k(int grp) const {
    return operands == Operands::FusedQkv ? int64_t(grp) * (hpg() + 2) * d + int64_t(hpg()) * d
                                          : int64_t(grp) * 2 * d;
  }
  int64_t v(int grp) const { return k(grp) + d; }
};

// The kernel's view of a built case: operand tensors (filled from the reference values) and
// the op's arguments.
struct KernelCall {
  Columns cols;
  Tensor qt, kvt;  // kvt == qt for fused QKV
  AttentionInputs in;
  AttentionMask mask;
  AttentionShape shape;
};

KernelCall kernel_call(const Case& c, const Built& r) {
  const RefAttention& a = r.a;
  KernelCall k{Columns{c.n, c.g, c.d, c.operands}, {}, {}, {}, {}, {}};
  const Columns& cl = k.cols;
  std::vector<float> qbuf(size_t(c.b * c.sq * cl.q_width()), 7.0f);
  std::vector<float> kvbuf(size_t(r.kv_seqs * a.skv * cl.kv_width()), 7.0f);
  std::vector<float>& kvdst = c.operands == Operands::FusedQkv ? qbuf : kvbuf;
  for (int64_t row = 0; row < c.b * c.sq; ++row)
    for (int h = 0; h < c.n; ++h)
      for (int e = 0; e < c.d; ++e)
        qbuf[size_t(row * cl.q_width() + cl.q(h) + e)] = float(r.x.q[size_t((row * c.n + h) * c.d + e)]);
  for (int64_t row = 0; row < r.kv_seqs * a.skv; ++row)
    for (int grp = 0; grp < c.g; ++grp)
      for (int e = 0; e < c.d; ++e) {
        const size_t at = size_t((row * c.g + grp) * c.d + e);
        kvdst[size_t(row * cl.kv_width() + cl.k(grp) + e)] = float(r.x.k[at]);
        kvdst[size_t(row * cl.kv_width() + cl.v(grp) + e)] = float(r.x.v[at]);
      }
  k.qt = Tensor::from_vector(qbuf, {c.b * c.sq, cl.q_width()});
  k.kvt = c.operands == Operands::FusedQkv ? k.qt : Tensor::from_vector(kvbuf, {r.kv_seqs * a.skv, cl.kv_width()});
  AttentionInputs& in = k.in;
  in.q = k.qt;
  in.k = in.v = k.kvt;
  switch (c.operands) {
    case Operands::FusedQkv:
      in.q_layout = HeadLayout::qkv(QkvPart::Query, c.n, c.g, c.d, c.sq);
      in.k_layout = HeadLayout::qkv(QkvPart::Key, c.n, c.g, c.d, a.skv);
      in.v_layout = HeadLayout::qkv(QkvPart::Value, c.n, c.g, c.d, a.skv);
      break;
    case Operands::SeparateQFusedKv:
    case Operands::QkvQueriesPackedKv:
      in.q_layout = c.operands == Operands::SeparateQFusedKv
                        ? HeadLayout::heads(c.n, c.d, c.sq)
                        : HeadLayout::qkv(QkvPart::Query, c.n, c.g, c.d, c.sq);
      in.k_layout = HeadLayout::kv(QkvPart::Key, c.g, c.d, a.skv);
      in.v_layout = HeadLayout::kv(QkvPart::Value, c.g, c.d, a.skv);
      break;
  }
  testing::set_case_arguments(c, r, in, k.mask, k.shape);
  return k;
}

// A gradient tensor with the operand's layout -> plain [rows, heads, d] values.
std::vector<double> unpack(const Tensor& t, int64_t rows, int heads, int d,
                           const std::function<int64_t(int)>& col) {
  const std::vector<float> v = t.to_float_vector();
  const int64_t w = t.size(-1);
  std::vector<double> out;
  for (int64_t row = 0; row < rows; ++row)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < d; ++e) out.push_back(v[size_t(row * w + col(h) + e)]);
  return out;
}

void expect_near(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& want, double atol, double eps) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= atol + std::abs(want[i]) * eps)) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " off; first at " << first
                    << ": got " << (first >= 0 ? got[size_t(first)] : 0.0) << " want "
                    << (first >= 0 ? want[size_t(first)] : 0.0);
}

std::vector<double> scaled(const std::vector<double>& v, double s) {
  std::vector<double> out(v);
  for (double& x : out) x *= s;
  return out;
}

void run_case(const Case& c) {
  const Built r = build(c);
  const RefAttention& a = r.a;
  const testing::RefForward ref = testing::reference_forward(a, r.x);
  const std::vector<double> dout = random_values(size_t(c.b * c.sq * c.n * c.d), 35);
  const bool backward = c.kv_index.empty();
  RefValues gref, fd;
  if (backward) {
    gref = testing::reference_backward(a, r.x, dout);
    if (c.finite_differences) {  // the analytic reference against central differences
      fd = testing::reference_finite_differences(a, r.x, dout);
      expect_near("reference dq vs finite differences", gref.q, fd.q, 1e-6, 1e-6);
      expect_near("reference dk vs finite differences", gref.k, fd.k, 1e-6, 1e-6);
      expect_near("reference dv vs finite differences", gref.v, fd.v, 1e-6, 1e-6);
      expect_near("reference dbias vs finite differences", gref.bias, fd.bias, 1e-6, 1e-6);
    }
  }
  for (bool save_probs : {true, false}) {
    SCOPED_TRACE(save_probs ? "probabilities saved" : "probabilities recomputed");
    const KernelCall k = kernel_call(c, r);
    const int64_t rows = c.b * c.sq, width = int64_t(c.n) * c.d;
    Tensor out = Tensor::full({rows, width}, 5.0, DType::F32);  // must be fully written
    Tensor lse = Tensor::full({c.b, c.n, c.sq}, 5.0, DType::F32);
    Tensor probs = save_probs ? Tensor::full({c.b, c.n, c.sq, a.skv}, 3.0, DType::F32) : Tensor();
    attention_fwd(out, lse, probs, k.in, k.mask, k.shape, a.dropout);
    testing::expect_close("out", out, ref.out, 1e-5);
    testing::expect_close("lse", lse, ref.lse, 1e-5);
    if (save_probs) testing::expect_close("probs", probs, ref.probs, 1e-6);
    if (!backward) continue;
    std::vector<float> df(dout.begin(), dout.end());
    const Tensor dout_t = Tensor::from_vector(df, {rows, width});
    const bool fused = c.operands == Operands::FusedQkv;
    Tensor dq = Tensor::full(k.qt.shape(), 123.0, DType::F32);  // written columns checked below
    Tensor dkv = fused ? dq : Tensor::full(k.kvt.shape(), 123.0, DType::F32);
    Tensor dbias = c.bias ? Tensor::full(k.in.bias.shape(), 123.0, DType::F32) : Tensor();
    const AttentionGrads grads{dq, dkv, dkv, dbias};
    const Columns& cl = k.cols;
    for (int pass = 1; pass <= 2; ++pass) {  // pass 2 accumulates: twice the gradients
      SCOPED_TRACE(pass == 1 ? "written" : "accumulated");
      attention_bwd(grads, dout_t, out, lse, probs, k.in, k.mask, k.shape, a.dropout, pass == 2);
      const int64_t kv_rows = r.kv_seqs * a.skv;
      const std::vector<double> gq = unpack(dq, rows, c.n, c.d, [&](int h) { return cl.q(h); });
      const std::vector<double> gk = unpack(dkv, kv_rows, c.g, c.d, [&](int g) { return cl.k(g); });
      const std::vector<double> gv = unpack(dkv, kv_rows, c.g, c.d, [&](int g) { return cl.v(g); });
      expect_near("dq", gq, scaled(gref.q, pass), 2e-5, 1e-4);
      expect_near("dk", gk, scaled(gref.k, pass), 2e-5, 1e-4);
      expect_near("dv", gv, scaled(gref.v, pass), 2e-5, 1e-4);
      if (c.bias) expect_near("dbias", testing::to_double(dbias), scaled(gref.bias, pass), 2e-5, 1e-4);
      if (pass == 1 && c.finite_differences) {
        expect_near("dq vs finite differences", gq, fd.q, 2e-5, 1e-4);
        expect_near("dk vs finite differences", gk, fd.k, 2e-5, 1e-4);
        expect_near("dv vs finite differences", gv, fd.v, 2e-5, 1e-4);
        if (c.bias) expect_near("dbias vs finite differences", testing::to_double(dbias), fd.bias, 2e-5, 1e-4);
      }
    }
  }
}

// ---- every mask kind on self-attention (fused QKV) ---------------------------------------------

TEST(CoreAttention, CausalGroupedQueryWithDocumentStarts) {
  run_case({.b = 2, .sq = 9, .n = 4, .g = 2, .d = 3, .starts = true});
}
TEST(CoreAttention, MultiQueryCausal) { run_case({.b = 1, .sq = 6, .n = 3, .g = 1, .d = 4}); }
TEST(CoreAttention, BidirectionalKeyPaddingWithAFullyPaddedSequence) {
  run_case({.b = 2, .sq = 6, .n = 2, .g = 1, .d = 3, .causal = false, .padding = true});
  run_case({.b = 2, .sq = 6, .n = 2, .g = 2, .d = 3, .causal = true, .padding = true});
}
TEST(CoreAttention, SlidingWindows) {
  run_case({.b = 2, .sq = 10, .n = 2, .g = 1, .d = 3, .wl = 2, .starts = true});  // causal
  run_case({.b = 1, .sq = 5, .n = 1, .g = 1, .d = 3, .wl = 0});  // sees itself only
  run_case({.b = 1, .sq = 9, .n = 2, .g = 1, .d = 3, .causal = false, .wl = 2, .wr = 1});
  run_case({.b = 1, .sq = 8, .n = 2, .g = 2, .d = 3, .causal = false, .wl = 3});
  run_case({.b = 1, .sq = 8, .n = 2, .g = 2, .d = 3, .causal = false, .wr = 0});
}
// 6 heads: the interleaved slopes of a non-power-of-two count; heads 2..5 of 8 (a tensor-parallel
// rank's) take their global slopes and dropout masks.
TEST(CoreAttention, AlibiOnGlobalHeads) {
  run_case({.b = 1, .sq = 8, .n = 6, .g = 3, .d = 2, .alibi = true});
  run_case({.b = 1, .sq = 8, .n = 6, .g = 3, .d = 2, .causal = false, .alibi = true});
  run_case({.b = 2, .sq = 7, .n = 4, .g = 2, .d = 2, .causal = false, .alibi = true, .p = 0.25f,
            .head_offset = 2, .total_heads = 8});
}
TEST(CoreAttention, DropoutWithEveryMaskAndABias) {
  run_case({.b = 2, .sq = 7, .n = 2, .g = 2, .d = 2, .alibi = true, .wl = 3, .starts = true,
            .bias = 2, .p = 0.3f});
  run_case({.b = 2, .sq = 7, .n = 2, .g = 1, .d = 2, .causal = false, .alibi = true, .wl = 2,
            .wr = 3, .padding = true, .bias = 1, .p = 0.3f});
}

// ---- bias, cross-attention, positions -----------------------------------------------------------

TEST(CoreAttention, BiasPerBatchRowAndBroadcast) {
  run_case({.b = 2, .sq = 6, .n = 2, .g = 1, .d = 3, .bias = 2});
  run_case({.b = 3, .sq = 5, .n = 2, .g = 2, .d = 3, .causal = false, .bias = 1});  // summed dbias
}
// Queries and keys of different lengths: a separate query projection against a fused KV
// (Megatron-Core's cross-attention), bidirectional with key padding and a relative-position bias.
TEST(CoreAttention, CrossAttentionSeparateQueriesAndFusedKeyValues) {
  run_case({.b = 2, .sq = 5, .skv = 8, .n = 4, .g = 4, .d = 3,
            .operands = Operands::SeparateQFusedKv, .causal = false, .padding = true, .bias = 2});
  run_case({.b = 1, .sq = 9, .skv = 4, .n = 4, .g = 2, .d = 3,
            .operands = Operands::SeparateQFusedKv, .causal = false, .bias = 1, .p = 0.2f});
}
// Context parallelism's all-gather: fused-QKV queries at positions {0, 1, 6, 7} of 8 against the
// whole sequence's packed keys and values; the masks and dropout are those of the whole.
TEST(CoreAttention, QuerySubsetAgainstTheWholeSequence) {
  run_case({.b = 2, .sq = 4, .skv = 8, .n = 4, .g = 2, .d = 3,
            .operands = Operands::QkvQueriesPackedKv, .starts = true, .p = 0.3f,
            .qpos = {0, 1, 6, 7}, .q_span = 8, .kv_span = 8});
}
// The ring's blocks: queries at {0, 1, 10, 11} against the key block at {2, 3, 8, 9} of 12, causal
// with starts and dropout, and bidirectional with a window, padding (by key position) and a bias.
TEST(CoreAttention, QueriesAgainstAKeyBlockAtPositions) {
  const std::vector<int32_t> q{0, 1, 10, 11}, k{2, 3, 8, 9};
  run_case({.b = 2, .sq = 4, .skv = 4, .n = 4, .g = 2, .d = 3,
            .operands = Operands::QkvQueriesPackedKv, .starts = true, .p = 0.3f, .qpos = q,
            .kpos = k, .q_span = 12, .kv_span = 12});
  run_case({.b = 2, .sq = 4, .skv = 4, .n = 2, .g = 1, .d = 3,
            .operands = Operands::QkvQueriesPackedKv, .causal = false, .alibi = true, .wl = 8,
            .padding = true, .bias = 1, .qpos = q, .kpos = k, .q_span = 12, .kv_span = 12});
}
// The KV-cache form: one query row per batch row, reading the key/value sequence kv_index names
// at its own position (forward only).
TEST(CoreAttention, RowsReadTheKeyValueSequenceKvIndexNames) {
  run_case({.b = 5, .sq = 1, .skv = 7, .n = 4, .g = 2, .d = 3,
            .operands = Operands::SeparateQFusedKv, .alibi = true, .wl = 4,
            .qpos = {6}, .kv_index = {2, 0, 2, 1, 0}, .q_span = 7});
}

// ---- long sequences: several 64-row tiles and 512-key blocks (online softmax) --------------------

TEST(CoreAttention, LongSequencesAcrossTilesAndKeyBlocks) {
  run_case({.b = 1, .sq = 600, .n = 2, .g = 1, .d = 4, .wl = 530, .starts = true, .p = 0.1f,
            .finite_differences = false});
  run_case({.b = 2, .sq = 70, .skv = 1100, .n = 2, .g = 2, .d = 4,
            .operands = Operands::SeparateQFusedKv, .causal = false, .padding = true, .bias = 1,
            .finite_differences = false});
  Case alibi{.b = 1, .sq = 130, .skv = 700, .n = 2, .g = 1, .d = 2,
             .operands = Operands::QkvQueriesPackedKv, .alibi = true, .finite_differences = false};
  for (int32_t i = 0; i < 130; ++i) alibi.qpos.push_back(570 + i);  // the last rows of 700 keys
  alibi.q_span = 700;
  run_case(alibi);
}

// ---- argument checks ------------------------------------------------------------------------------

TEST(CoreAttention, RejectsInconsistentArguments) {
  const Case c{.b = 1, .sq = 4, .n = 1, .g = 1, .d = 2};
  const Built r = build(c);
  const KernelCall k = kernel_call(c, r);
  Tensor out = Tensor::empty({4, 2}, DType::F32), lse = Tensor::empty({1, 1, 4}, DType::F32);
  const DropoutSpec none;
  EXPECT_NO_THROW(attention_fwd(out, lse, Tensor(), k.in, k.mask, k.shape, none));
  AttentionMask m = k.mask;
  m.window_right = 2;  // needs bidirectional attention
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), k.in, m, k.shape, none), InternalError);
  m = k.mask;
  m.window_left = -3;
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), k.in, m, k.shape, none), InternalError);
  m = k.mask;
  m.key_padding = Tensor::from_vector(std::vector<int32_t>{1, 1, 1}, {1, 3});  // [kv seqs, 4]
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), k.in, m, k.shape, none), InternalError);
  m = k.mask;
  m.window_right = 0;  // what causal means: accepted
  EXPECT_NO_THROW(attention_fwd(out, lse, Tensor(), k.in, m, k.shape, none));
  AttentionShape longer = k.shape;
  longer.seq = longer.kv_seq = 5;  // more rows than the operand holds
  EXPECT_THROW(attention_fwd(Tensor::empty({5, 2}, DType::F32), Tensor(), Tensor(), k.in, k.mask,
                             longer, none),
               InternalError);
  AttentionInputs in = k.in;
  in.kv_positions = Tensor::from_vector(std::vector<int32_t>{0, 2, 1, 3}, {4});  // not ascending
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), in, k.mask, k.shape, none), InternalError);
  in = k.in;
  in.q_positions = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 4}, {4});  // beyond q_span
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), in, k.mask, k.shape, DropoutSpec{0.5f, 1, 2}),
               InternalError);
  in = k.in;
  in.bias = Tensor::zeros({1, 1, 4, 3}, DType::F32);  // [1 or b, n, q_span, kv_span]
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), in, k.mask, k.shape, none), InternalError);
  const Tensor dqkv = Tensor::empty(k.qt.shape(), DType::F32);
  const AttentionGrads grads{dqkv, dqkv, dqkv, Tensor()};
  attention_fwd(out, lse, Tensor(), k.in, k.mask, k.shape, none);
  EXPECT_NO_THROW(attention_bwd(grads, out, out, lse, Tensor(), k.in, k.mask, k.shape, none));
  in = k.in;
  in.kv_index = Tensor::from_vector(std::vector<int32_t>{0}, {1});  // forward only
  EXPECT_THROW(attention_bwd(grads, out, out, lse, Tensor(), in, k.mask, k.shape, none),
               InternalError);
  EXPECT_THROW(attention_bwd({dqkv, dqkv, dqkv, Tensor::zeros({1, 1, 4, 4}, DType::F32)}, out,
                             out, lse, Tensor(), k.in, k.mask, k.shape, none),
               InternalError);  // dbias without a bias
}

}  // namespace
}  // namespace megatron::ops
