// The core attention op's bf16 kernel (q, k, v bf16) against the float64 reference of
// attention_reference.h run on the same bf16 values: output, log-sum-exp, saved probabilities and
// dq, dk, dv, dbias at bf16 tolerance (the kernel rounds the probabilities, the incoming gradient
// and the softmax gradient to bf16 for its products), on the CPU's own bf16 unit and on the fp32
// unit forced. Every mask kind, GQA and MQA, a bias (per batch row and broadcast), dropout,
// queries and keys of different lengths (a separate query tensor against fused keys and values),
// positions, the KV-cache form, tiles and key blocks of long sequences; the tile products alone
// against float64 at odd sizes; and the argument checks (one dtype for q, k and v; a unit the CPU
// lacks).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "attention_case.h"
#include "attention_reference.h"
#include "core/error.h"
#include "core/half.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_attention_bf16.h"

namespace megatron::ops {
namespace {
using testing::RefAttention;
using testing::RefValues;

using testing::Operands;
using Case = testing::AttentionCase;

// Normal values rounded to bf16, as doubles.
std::vector<double> bf16_values(size_t n, uint64_t stream) {
  std::vector<double> v = testing::to_double(testing::randn({int64_t(n)}, stream));
  for (double& x : v) x = double(bf16_to_float(float_to_bf16(float(x))));
  return v;
}

struct Built : testing::ReferenceCase {
  Tensor qt, kvt;  // bf16 operands (kvt == qt when fused)
  AttentionInputs in;
  AttentionMask mask;
  AttentionShape shape;
  int64_t qw = 0, kvw = 0;
  // Column of query head h, key / value head grp in a row of the operand tensors.
  int64_t qcol(int h) const {
    const HeadLayout& L = in.q_layout;
    return L.offset + int64_t(h / L.heads_per_group) * L.group_stride +
           int64_t(h % L.heads_per_group) * a.d;
  }
  int64_t kcol(int grp) const { return in.k_layout.offset + grp * in.k_layout.group_stride; }
  int64_t vcol(int grp) const { return in.v_layout.offset + grp * in.v_layout.group_stride; }
};

Built build(const Case& c) {
  MG_CHECK(c.operands != Operands::QkvQueriesPackedKv, "the bf16 cases are fused or separate Q");
  Built r;
  static_cast<testing::ReferenceCase&>(r) = testing::reference_case(c, bf16_values, 41);
  const RefAttention& a = r.a;
  const bool cross = c.operands == Operands::SeparateQFusedKv;
  AttentionInputs& in = r.in;
  if (cross) {
    in.q_layout = HeadLayout::heads(c.n, c.d, c.sq);
    in.k_layout = HeadLayout::kv(QkvPart::Key, c.g, c.d, a.skv);
    in.v_layout = HeadLayout::kv(QkvPart::Value, c.g, c.d, a.skv);
    r.qw = int64_t(c.n) * c.d;
    r.kvw = int64_t(c.g) * 2 * c.d;
  } else {
    in.q_layout = HeadLayout::qkv(QkvPart::Query, c.n, c.g, c.d, c.sq);
    in.k_layout = HeadLayout::qkv(QkvPart::Key, c.n, c.g, c.d, a.skv);
    in.v_layout = HeadLayout::qkv(QkvPart::Value, c.n, c.g, c.d, a.skv);
    r.qw = r.kvw = int64_t(c.g) * (c.n / c.g + 2) * c.d;
  }
  std::vector<float> qbuf(size_t(c.b * c.sq * r.qw), 9.0f);
  std::vector<float> kvbuf(size_t(r.kv_seqs * a.skv * r.kvw), 9.0f);
  std::vector<float>& kvdst = cross ? kvbuf : qbuf;
  for (int64_t row = 0; row < c.b * c.sq; ++row)
    for (int h = 0; h < c.n; ++h)
      for (int e = 0; e < c.d; ++e)
        qbuf[size_t(row * r.qw + r.qcol(h) + e)] = float(r.x.q[size_t((row * c.n + h) * c.d + e)]);
  for (int64_t row = 0; row < r.kv_seqs * a.skv; ++row)
    for (int grp = 0; grp < c.g; ++grp)
      for (int e = 0; e < c.d; ++e) {
        const size_t at = size_t((row * c.g + grp) * c.d + e);
        kvdst[size_t(row * r.kvw + r.kcol(grp) + e)] = float(r.x.k[at]);
        kvdst[size_t(row * r.kvw + r.vcol(grp) + e)] = float(r.x.v[at]);
      }
  auto to_bf16 = [](const std::vector<float>& v, Shape s) {
    Tensor t = Tensor::empty(s, DType::BF16);
    bf16* p = t.data<bf16>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = float_to_bf16(v[i]);
    return t;
  };
  r.qt = to_bf16(qbuf, {c.b * c.sq, r.qw});
  r.kvt = cross ? to_bf16(kvbuf, {r.kv_seqs * a.skv, r.kvw}) : r.qt;
  in.q = r.qt;
  in.k = in.v = r.kvt;
  testing::set_case_arguments(c, r, in, r.mask, r.shape);
  return r;
}

// Columns col(h) of a [rows, width] fp32 gradient -> plain [rows, heads, d] values.
template <class Col>
std::vector<double> unpack(const Tensor& t, int64_t rows, int heads, int d, Col col) {
  const std::vector<float> v = t.to_float_vector();
  const int64_t w = t.size(-1);
  std::vector<double> out;
  for (int64_t row = 0; row < rows; ++row)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < d; ++e) out.push_back(v[size_t(row * w + col(h) + e)]);
  return out;
}

std::vector<double> times(const std::vector<double>& v, double s) {
  std::vector<double> out(v);
  for (double& x : out) x *= s;
  return out;
}

// bf16 tolerance: |got - want| <= atol + |want| * rtol elementwise.
constexpr double kAtol = 2e-2, kRtol = 2e-2;

void run_case(const Case& c) {
  const Built r = build(c);
  const RefAttention& a = r.a;
  const testing::RefForward ref = testing::reference_forward(a, r.x);
  std::vector<double> dout = testing::to_double(testing::randn({c.b * c.sq * c.n * c.d}, 45));
  const bool backward = c.kv_index.empty();
  const RefValues gref = backward ? testing::reference_backward(a, r.x, dout) : RefValues{};
  for (const cpu::Bf16Unit unit : cpu::bf16_units_available()) {
    cpu::set_bf16_tile_unit(unit);
    SCOPED_TRACE(cpu::bf16_unit_name(unit));
    for (bool save_probs : {true, false}) {
      SCOPED_TRACE(save_probs ? "probabilities saved" : "probabilities recomputed");
      const int64_t rows = c.b * c.sq, width = int64_t(c.n) * c.d;
      Tensor out = Tensor::full({rows, width}, 5.0, DType::F32);
      Tensor lse = Tensor::full({c.b, c.n, c.sq}, 5.0, DType::F32);
      Tensor probs = save_probs ? Tensor::full({c.b, c.n, c.sq, a.skv}, 3.0, DType::F32) : Tensor();
      attention_fwd(out, lse, probs, r.in, r.mask, r.shape, a.dropout);
      testing::expect_close("out", out, ref.out, kAtol, kRtol);
      testing::expect_close("lse", lse, ref.lse, 1e-4, 1e-5);  // fp32 sums of exact products
      if (save_probs) testing::expect_close("probs", probs, ref.probs, 1e-5, 1e-4);
      if (!backward) continue;
      const std::vector<float> df(dout.begin(), dout.end());
      const Tensor dout_t = Tensor::from_vector(df, {rows, width});
      Tensor dq = Tensor::full(r.qt.shape(), 123.0, DType::F32);
      Tensor dkv = c.operands == Operands::SeparateQFusedKv ? Tensor::full(r.kvt.shape(), 123.0, DType::F32) : dq;
      Tensor dbias = c.bias ? Tensor::full(r.in.bias.shape(), 123.0, DType::F32) : Tensor();
      for (int pass = 1; pass <= 2; ++pass) {  // pass 2 accumulates: twice the gradients
        SCOPED_TRACE(pass == 1 ? "written" : "accumulated");
        attention_bwd({dq, dkv, dkv, dbias}, dout_t, out, lse, probs, r.in, r.mask, r.shape,
                      a.dropout, pass == 2);
        const int64_t kv_rows = r.kv_seqs * a.skv;
        const auto as_tensor = [](const std::vector<double>& v) {
          return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), {int64_t(v.size())});
        };
        const auto qc = [&](int h) { return r.qcol(h); };
        const auto kc = [&](int grp) { return r.kcol(grp); };
        const auto vc = [&](int grp) { return r.vcol(grp); };
        testing::expect_close("dq", as_tensor(unpack(dq, rows, c.n, c.d, qc)), times(gref.q, pass),
                              kAtol, kRtol);
        testing::expect_close("dk", as_tensor(unpack(dkv, kv_rows, c.g, c.d, kc)),
                              times(gref.k, pass), kAtol, kRtol);
        testing::expect_close("dv", as_tensor(unpack(dkv, kv_rows, c.g, c.d, vc)),
                              times(gref.v, pass), kAtol, kRtol);
        if (c.bias) testing::expect_close("dbias", dbias, times(gref.bias, pass), kAtol, kRtol);
      }
    }
  }
  cpu::reset_bf16_tile_unit();
}

// ---- masks on self-attention (fused QKV), GQA, MQA ----------------------------------------------

TEST(CoreAttentionBf16, CausalGroupedQueryWithDocumentStarts) {
  run_case({.b = 2, .sq = 9, .n = 4, .g = 2, .d = 8, .starts = true});
}
TEST(CoreAttentionBf16, MultiQueryCausalOddHeadDim) {
  run_case({.b = 1, .sq = 6, .n = 3, .g = 1, .d = 5});
}
TEST(CoreAttentionBf16, BidirectionalKeyPaddingWithAFullyPaddedSequence) {
  run_case({.b = 2, .sq = 6, .n = 2, .g = 1, .d = 6, .causal = false, .padding = true});
}
TEST(CoreAttentionBf16, SlidingWindows) {
  run_case({.b = 2, .sq = 10, .n = 2, .g = 1, .d = 4, .wl = 2, .starts = true});
  run_case({.b = 1, .sq = 9, .n = 2, .g = 1, .d = 4, .causal = false, .wl = 2, .wr = 1});
}
TEST(CoreAttentionBf16, AlibiDropoutAndABias) {
  run_case({.b = 2, .sq = 7, .n = 4, .g = 2, .d = 4, .alibi = true, .wl = 3, .starts = true,
            .bias = 2, .p = 0.3f});
  run_case({.b = 2, .sq = 7, .n = 2, .g = 1, .d = 4, .causal = false, .alibi = true,
            .padding = true, .bias = 1, .p = 0.3f});
}

// ---- queries and keys of different lengths, positions, the KV-cache form -----------------------

TEST(CoreAttentionBf16, CrossAttentionSeparateQueriesAndFusedKeyValues) {
  run_case({.b = 2, .sq = 5, .skv = 8, .n = 4, .g = 4, .d = 6, .operands = Operands::SeparateQFusedKv, .causal = false,
            .padding = true, .bias = 2});
  run_case({.b = 1, .sq = 9, .skv = 4, .n = 4, .g = 2, .d = 6, .operands = Operands::SeparateQFusedKv, .causal = false,
            .bias = 1, .p = 0.2f});
}
TEST(CoreAttentionBf16, QueriesAgainstAKeyBlockAtPositions) {
  run_case({.b = 2, .sq = 4, .skv = 4, .n = 4, .g = 2, .d = 4, .operands = Operands::SeparateQFusedKv, .starts = true,
            .p = 0.3f, .qpos = {0, 1, 10, 11}, .kpos = {2, 3, 8, 9}, .q_span = 12,
            .kv_span = 12});
}
// Decoding: one query row per batch row against the bf16 key/value sequence kv_index names.
TEST(CoreAttentionBf16, RowsReadTheKeyValueSequenceKvIndexNames) {
  run_case({.b = 5, .sq = 1, .skv = 7, .n = 4, .g = 2, .d = 8, .operands = Operands::SeparateQFusedKv, .alibi = true,
            .wl = 4, .qpos = {6}, .kv_index = {2, 0, 2, 1, 0}, .q_span = 7});
}
// A prefill chunk: consecutive rows of one key/value sequence run as one tile of packed pairs.
TEST(CoreAttentionBf16, APrefillChunkOfOneSequence) {
  run_case({.b = 6, .sq = 1, .skv = 9, .n = 4, .g = 2, .d = 8, .operands = Operands::SeparateQFusedKv, .causal = false,
            .bias = 2, .qpos = {7}, .kv_index = {1, 1, 1, 1, 1, 0}, .q_span = 9});
}

// ---- long sequences: several 64-row tiles and 512-key blocks -------------------------------------

TEST(CoreAttentionBf16, LongSequencesAcrossTilesAndKeyBlocks) {
  run_case({.b = 1, .sq = 600, .n = 2, .g = 1, .d = 16, .wl = 530, .starts = true, .p = 0.1f});
  run_case({.b = 2, .sq = 70, .skv = 1100, .n = 2, .g = 2, .d = 8, .operands = Operands::SeparateQFusedKv,
            .causal = false, .padding = true, .bias = 1});
}

// ---- the tile products alone ---------------------------------------------------------------------

// C = alpha A B + beta C on packed pairs at odd sizes (row and column tails of the 8 x 32
// register blocks, odd reduction lengths): A packed along its rows (row-major pairs, also with
// the leading zero of a block starting at an odd key) and along its columns (interleaved), B
// along its rows and transposed, against float64 products of the bf16-rounded operands.
TEST(CoreAttentionBf16, TileProductsAtOddSizes) {
  for (const cpu::Bf16Unit unit : cpu::bf16_units_available()) {
    cpu::set_bf16_tile_unit(unit);
    SCOPED_TRACE(cpu::bf16_unit_name(unit));
    for (const auto& [m, n, k] : {std::tuple{13, 37, 19}, {1, 5, 1}, {8, 32, 64}, {70, 3, 2}}) {
      SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k));
      const std::vector<double> av = bf16_values(size_t(m * k), 50), bv = bf16_values(size_t(k * n), 51);
      const std::vector<float> af(av.begin(), av.end());
      std::vector<bf16> b16(size_t(k * n)), bz(size_t((k + 1) * n)), bt(size_t(n * k));
      std::vector<float> at(size_t(k * m));  // A^T [k, m]
      for (int e = 0; e < k; ++e) {
        for (int j = 0; j < n; ++j) {
          b16[size_t(e * n + j)] = bz[size_t((e + 1) * n + j)] = bt[size_t(j * k + e)] =
              float_to_bf16(float(bv[size_t(e * n + j)]));
        }
        for (int i = 0; i < m; ++i) at[size_t(e * m + i)] = af[size_t(i * k + e)];
      }
      const int64_t kp = cpu::pairs_of(k), kz = cpu::pairs_of(k + 1);
      std::vector<uint32_t> a_cols(size_t(m * kp)), a_lead(size_t(m * kz)), a_rows(size_t(kp * m));
      std::vector<uint32_t> b_rows(size_t(kp * n)), b_lead(size_t(kz * n)), b_t(size_t(kp * n));
      cpu::pack_pairs_cols(a_cols.data(), kp, af.data(), k, m, k);
      cpu::pack_pairs_cols(a_lead.data(), kz, af.data(), k, m, k, 1);
      cpu::pack_pairs_rows(a_rows.data(), m, at.data(), m, k, m);
      cpu::pack_pairs_rows(b_rows.data(), n, b16.data(), n, k, n);
      cpu::pack_pairs_rows(b_lead.data(), n, bz.data(), n, k + 1, n);
      cpu::pack_pairs_cols_t(b_t.data(), n, bt.data(), k, n, k);
      std::vector<double> want(size_t(m * n));
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int e = 0; e < k; ++e) s += av[size_t(i * k + e)] * bv[size_t(e * n + j)];
          want[size_t(i * n + j)] = 0.5 * s + 2.0 * (i - j);  // alpha 0.5, beta 2, C = i - j
        }
      struct Form {
        const char* name;
        cpu::PairsA a;
        const uint32_t* b;
        int64_t pairs;
      };
      for (const Form& f : {Form{"A by rows, B by rows", {a_cols.data(), kp, 1}, b_rows.data(), kp},
                            Form{"A with a leading zero", {a_lead.data(), kz, 1}, b_lead.data(), kz},
                            Form{"A by columns, B transposed", {a_rows.data(), 1, m}, b_t.data(), kp}}) {
        SCOPED_TRACE(f.name);
        const int64_t ldc = n + 3;
        std::vector<float> c(size_t(m * ldc));
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < ldc; ++j) c[size_t(i * ldc + j)] = float(i - j);
        cpu::gemm_bf16_pairs(m, n, f.pairs, 0.5f, f.a, f.b, n, 2.0f, c.data(), ldc);
        std::vector<float> got;
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < ldc; ++j) {
            if (j < n) got.push_back(c[size_t(i * ldc + j)]);
            else EXPECT_EQ(c[size_t(i * ldc + j)], float(i - j)) << "written outside C";
          }
        testing::expect_close("C", Tensor::from_vector(got, {m, n}), want, 1e-4, 1e-5);
      }
    }
  }
  cpu::reset_bf16_tile_unit();
}

// ---- argument checks ------------------------------------------------------------------------------

TEST(CoreAttentionBf16, RejectsMixedOperandDtypesAndAMissingUnit) {
  const Case c{.b = 1, .sq = 4, .skv = 4, .n = 2, .g = 1, .d = 4, .operands = Operands::SeparateQFusedKv};
  Built r = build(c);
  Tensor out = Tensor::empty({4, 8}, DType::F32), lse = Tensor::empty({1, 2, 4}, DType::F32);
  EXPECT_NO_THROW(attention_fwd(out, lse, Tensor(), r.in, r.mask, r.shape, DropoutSpec{}));
  AttentionInputs in = r.in;
  in.k = in.v = Tensor::zeros(r.kvt.shape(), DType::F32);  // fp32 keys with bf16 queries
  try {
    attention_fwd(out, lse, Tensor(), in, r.mask, r.shape, DropoutSpec{});
    ADD_FAILURE() << "mixed dtypes accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("one dtype"), std::string::npos) << e.what();
  }
  in = r.in;
  in.q = Tensor::zeros(r.qt.shape(), DType::F16);
  EXPECT_THROW(attention_fwd(out, lse, Tensor(), in, r.mask, r.shape, DropoutSpec{}),
               InternalError);
  // bf16 gradients are refused: gradients are fp32
  const Tensor dq16 = Tensor::zeros(r.qt.shape(), DType::BF16);
  const Tensor dkv = Tensor::zeros(r.kvt.shape(), DType::F32);
  EXPECT_THROW(attention_bwd({dq16, dkv, dkv, Tensor()}, out, out, lse, Tensor(), r.in, r.mask,
                             r.shape, DropoutSpec{}),
               InternalError);
  cpu::reset_bf16_tile_unit();
  if (cpu::bf16_tile_unit() == cpu::Bf16Unit::Fp32) {
    EXPECT_THROW(cpu::set_bf16_tile_unit(cpu::Bf16Unit::Avx512Bf16), Error);
  } else {
    EXPECT_NO_THROW(cpu::set_bf16_tile_unit(cpu::Bf16Unit::Avx512Bf16));
  }
  cpu::reset_bf16_tile_unit();
}

}  // namespace
}  // namespace megatron::ops
