// KV-cache attention (inference) against a double reference of full causal attention over each
// slot's whole sequence: kv_cache_append, then the core attention op with the cache as keys and
// values (HeadLayout::cache), each row a query batch row at its position reading its slot
// (kv_index), as the model's attention runs it. Ragged prompts prefilled together (one over the
// 64-row tiles), then calls that mix a late prompt with decode steps of other slots at different
// positions, with GQA, a sliding window and ALiBi; and the argument checks. The same schedule with
// a bf16 cache (a bf16 model's: bf16 qkv rows, the bf16 attention kernel) against the reference of
// the bf16-rounded sequences and against the fp32 cache, at bf16 tolerance, on the CPU's bf16 unit
// and on the forced fp32 unit.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/ops.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;

constexpr int kHeads = 4, kGroups = 2, kDim = 5, kHpg = kHeads / kGroups;
constexpr int64_t kWidth = int64_t(kGroups) * (kHpg + 2) * kDim, kCtx = int64_t(kHeads) * kDim;

// ctx row (double) of the query at position p of a sequence seq [len, kWidth].
std::vector<double> reference_row(const std::vector<double>& seq, int64_t p, int64_t window,
                                  bool alibi) {
  std::vector<double> out(static_cast<size_t>(kCtx), 0.0);
  const std::vector<float> slopes = alibi_slopes(kHeads);
  const double scale = 1.0 / std::sqrt(double(kDim));
  for (int h = 0; h < kHeads; ++h) {
    const int grp = h / kHpg;
    const int64_t qo = int64_t(grp) * (kHpg + 2) * kDim + int64_t(h % kHpg) * kDim;
    const int64_t ko = int64_t(grp) * (kHpg + 2) * kDim + int64_t(kHpg) * kDim, vo = ko + kDim;
    const int64_t lo = window >= 0 ? std::max<int64_t>(0, p - window) : 0;
    std::vector<double> sc;
    double mx = -INFINITY;
    for (int64_t j = lo; j <= p; ++j) {
      double v = 0;
      for (int e = 0; e < kDim; ++e) v += seq[size_t(p * kWidth + qo + e)] * seq[size_t(j * kWidth + ko + e)];
      v = v * scale + (alibi ? double(slopes[size_t(h)]) * double(j - p) : 0.0);
      sc.push_back(v);
      mx = std::max(mx, v);
    }
    double se = 0;
    for (double v : sc) se += std::exp(v - mx);
    for (int64_t j = lo; j <= p; ++j)
      for (int e = 0; e < kDim; ++e)
        out[size_t(h * kDim + e)] +=
            std::exp(sc[size_t(j - lo)] - mx) / se * seq[size_t(j * kWidth + vo + e)];
  }
  return out;
}

struct Row {
  int32_t slot, pos;
};

// Attention of qkv's rows against their slots' cached keys and values.
void cached_attention(const Tensor& ctx, const Tensor& qkv, const Tensor& kc, const Tensor& vc,
                      const Tensor& slot, const Tensor& pos, int64_t window, bool alibi) {
  const int64_t n = qkv.size(0), max_len = kc.size(2);
  AttentionInputs in;
  in.q = qkv;
  in.q_layout = HeadLayout::qkv(QkvPart::Query, kHeads, kGroups, kDim, 1);
  in.k = kc;
  in.v = vc;
  in.k_layout = in.v_layout = HeadLayout::cache(kGroups, max_len, kDim);
  in.q_positions = pos;
  in.kv_index = slot;
  AttentionMask mask;
  mask.window_left = window;
  mask.alibi = alibi;
  AttentionShape sh{n, 1, kHeads, kGroups, kDim, 1.0f / std::sqrt(float(kDim))};
  sh.kv_seq = sh.q_span = max_len;
  attention_fwd(ctx, Tensor(), Tensor(), in, mask, sh, DropoutSpec{});
}

Tensor as_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  cast(out, t);
  return out;
}

// The schedule's outputs (one ctx tensor per call) with caches of `dtype`; the sequences are
// rounded to bf16 first when `round` (a bf16 model's qkv), and the double reference is that of
// the values the cache holds.
std::vector<Tensor> run_schedule(int64_t window, bool alibi, DType dtype = DType::F32,
                                 bool round = false) {
  SCOPED_TRACE("window " + std::to_string(window) + (alibi ? " alibi " : " ") +
               dtype_name(dtype));
  const int64_t slots = 3, max_len = 80;
  const std::vector<int64_t> lengths{72, 9, 9};
  std::vector<std::vector<float>> seqs;
  for (int64_t s = 0; s < slots; ++s) {
    seqs.push_back(randn({lengths[size_t(s)], kWidth}, 400 + uint64_t(s)).to_float_vector());
    if (round)
      for (float& v : seqs.back()) v = bf16_to_float(float_to_bf16(v));
  }
  AttentionShape sh;
  sh.heads = kHeads;
  sh.groups = kGroups;
  sh.head_dim = kDim;
  Tensor kc = as_dtype(Tensor::full({slots, kGroups, max_len, kDim}, NAN, DType::F32), dtype);
  Tensor vc = as_dtype(Tensor::full({slots, kGroups, max_len, kDim}, NAN, DType::F32), dtype);
  // Call 1: prompts of slots 0 (70 tokens, over a tile boundary) and 1 (5 tokens).
  // Call 2: slot 2's prompt (3 tokens) listed between decode rows of slots 1 and 0.
  // Then decode steps, one row per active slot, at different positions.
  std::vector<std::vector<Row>> calls(2);
  for (int32_t p = 0; p < 70; ++p) calls[0].push_back({0, p});
  for (int32_t p = 0; p < 5; ++p) calls[0].push_back({1, p});
  calls[1] = {{1, 5}, {2, 0}, {2, 1}, {2, 2}, {0, 70}};
  for (int32_t step = 0; step < 6; ++step) {
    std::vector<Row> c;
    if (step == 0) c.push_back({0, 71});
    if (6 + step < 9) c.push_back({1, 6 + step});
    c.push_back({2, 3 + step});
    calls.push_back(c);
  }
  // bf16: the probabilities are rounded to bf16 for P V, as a bf16 flash attention does.
  const double tol = dtype == DType::BF16 ? 1e-2 : 1e-5;
  std::vector<Tensor> outs;
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    SCOPED_TRACE("call " + std::to_string(ci));
    const std::vector<Row>& rows = calls[ci];
    const int64_t n = int64_t(rows.size());
    std::vector<float> x;
    std::vector<int32_t> slot, pos;
    std::vector<double> ref;
    for (const Row& r : rows) {
      const std::vector<float>& seq = seqs[size_t(r.slot)];
      x.insert(x.end(), seq.begin() + r.pos * kWidth, seq.begin() + (r.pos + 1) * kWidth);
      slot.push_back(r.slot);
      pos.push_back(r.pos);
      const std::vector<double> rr = reference_row({seq.begin(), seq.end()}, r.pos, window, alibi);
      ref.insert(ref.end(), rr.begin(), rr.end());
    }
    Tensor qkv = as_dtype(Tensor::from_vector(x, {n, kWidth}), dtype);
    Tensor ts = Tensor::from_vector(slot, {n}), tp = Tensor::from_vector(pos, {n});
    kv_cache_append(kc, vc, qkv, ts, tp, sh);
    Tensor ctx = Tensor::full({n, kCtx}, 7.0, DType::F32);
    cached_attention(ctx, qkv, kc, vc, ts, tp, window, alibi);
    expect_close("kv-cache ctx", ctx, ref, tol, tol);
    outs.push_back(ctx);
  }
  return outs;
}

std::vector<double> times2(std::vector<double> v) {
  for (double& x : v) x *= 2;
  return v;
}

// The bf16 cache on each unit: against the reference of its own (rounded) values, and against
// the fp32 cache of the unrounded sequences at bf16 tolerance.
void run_bf16_schedule(int64_t window, bool alibi) {
  const std::vector<Tensor> f32 = run_schedule(window, alibi);
  for (const cpu::Bf16Unit unit : cpu::bf16_units_available()) {
    cpu::set_bf16_tile_unit(unit);
    SCOPED_TRACE(cpu::bf16_unit_name(unit));
    const std::vector<Tensor> b16 = run_schedule(window, alibi, DType::BF16, true);
    ASSERT_EQ(b16.size(), f32.size());
    for (size_t i = 0; i < f32.size(); ++i)
      expect_close("bf16 cache against fp32 cache, call " + std::to_string(i), b16[i],
                   testing::to_double(f32[i]), 2e-2, 2e-2);
  }
  cpu::reset_bf16_tile_unit();
}

TEST(KvCache, PrefillAndDecodeAcrossSlotsMatchFullAttention) { run_schedule(-1, false); }
TEST(KvCache, SlidingWindow) { run_schedule(3, false); }
TEST(KvCache, Alibi) { run_schedule(-1, true); }
TEST(KvCache, SlidingWindowWithAlibiAcrossTiles) { run_schedule(66, true); }
TEST(KvCache, Bf16CacheOnEachUnit) { run_bf16_schedule(-1, false); }
TEST(KvCache, Bf16CacheSlidingWindowWithAlibi) { run_bf16_schedule(66, true); }

// The decode rows' own products (one query row against bf16 keys and values read in place) on
// each unit, against double sums of the same bf16 values: head sizes below, at and over the
// 32-element step, odd key counts (the last key's pair is zeros, never the row after it: NaN
// there), strided rows, beta 0 (old output ignored, NaN too) and beta 1.
TEST(KvCache, Bf16DecodeRowProductsOnEachUnit) {
  for (const cpu::Bf16Unit unit : cpu::bf16_units_available()) {
    cpu::set_bf16_tile_unit(unit);
    SCOPED_TRACE(cpu::bf16_unit_name(unit));
    for (const int64_t d : {5, 32, 64, 80, 130})
      for (const int64_t rows : {1, 2, 7, 33}) {
        SCOPED_TRACE("d " + std::to_string(d) + ", rows " + std::to_string(rows));
        const int64_t ld = d + 3;
        Tensor kv = as_dtype(randn({rows + 1, ld}, 430), DType::BF16);  // one row more: NaN
        Tensor q = as_dtype(randn({d}, 431), DType::BF16);
        Tensor p = as_dtype(randn({rows}, 432), DType::BF16);
        bf16* m = kv.data<bf16>();
        for (int64_t e = 0; e < ld; ++e) m[rows * ld + e] = float_to_bf16(NAN);
        auto at = [&](const Tensor& t, int64_t i) { return double(bf16_to_float(t.data<bf16>()[i])); };
        std::vector<double> s_ref(size_t(rows), 0.0), o_ref(size_t(d), 0.0);
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t e = 0; e < d; ++e) {
            s_ref[size_t(j)] += 0.5 * at(kv, j * ld + e) * at(q, e);
            o_ref[size_t(e)] += at(p, j) * at(kv, j * ld + e);
          }
        Tensor s = Tensor::full({rows}, NAN, DType::F32);
        cpu::decode_scores_bf16(m, rows, ld, d, q.data<bf16>(), 0.5f, s.data<float>());
        expect_close("scores", s, s_ref, 1e-4, 1e-4);
        Tensor o = Tensor::full({d}, NAN, DType::F32);
        cpu::decode_values_bf16(m, rows, ld, d, p.data<bf16>(), 0.0f, o.data<float>());
        expect_close("values", o, o_ref, 1e-4, 1e-4);
        cpu::decode_values_bf16(m, rows, ld, d, p.data<bf16>(), 1.0f, o.data<float>());
        expect_close("values, accumulated", o, times2(o_ref), 1e-4, 1e-4);
      }
  }
  cpu::reset_bf16_tile_unit();
}

TEST(KvCache, Bf16AppendStoresTheRowsBits) {
  AttentionShape sh;
  sh.heads = kHeads;
  sh.groups = kGroups;
  sh.head_dim = kDim;
  Tensor kc = Tensor::zeros({2, kGroups, 4, kDim}, DType::BF16), vc = kc.clone();
  Tensor qkv = as_dtype(randn({1, kWidth}, 411), DType::BF16);
  kv_cache_append(kc, vc, qkv, Tensor::from_vector(std::vector<int32_t>{1}, {1}),
                  Tensor::from_vector(std::vector<int32_t>{3}, {1}), sh);
  const bf16* k = kc.data<bf16>();
  const bf16* v = vc.data<bf16>();
  const bf16* x = qkv.data<bf16>();
  for (int g = 0; g < kGroups; ++g)
    for (int e = 0; e < kDim; ++e) {
      const int64_t at = ((1 * kGroups + g) * 4 + 3) * kDim + e;
      const int64_t col = int64_t(g) * (kHpg + 2) * kDim + kHpg * kDim + e;
      EXPECT_EQ(k[at].bits, x[col].bits);
      EXPECT_EQ(v[at].bits, x[col + kDim].bits);
    }
}

TEST(KvCache, AppendWritesTheRowsKeysAndValues) {
  AttentionShape sh;
  sh.heads = kHeads;
  sh.groups = kGroups;
  sh.head_dim = kDim;
  Tensor kc = Tensor::zeros({2, kGroups, 4, kDim}, DType::F32), vc = kc.clone();
  Tensor qkv = randn({1, kWidth}, 410);
  kv_cache_append(kc, vc, qkv, Tensor::from_vector(std::vector<int32_t>{1}, {1}),
                  Tensor::from_vector(std::vector<int32_t>{2}, {1}), sh);
  for (int g = 0; g < kGroups; ++g)
    for (int e = 0; e < kDim; ++e) {
      const int64_t at = ((1 * kGroups + g) * 4 + 2) * kDim + e;
      const int64_t col = int64_t(g) * (kHpg + 2) * kDim + kHpg * kDim + e;
      EXPECT_EQ(kc.item_as_double(at), qkv.item_as_double(col));
      EXPECT_EQ(vc.item_as_double(at), qkv.item_as_double(col + kDim));
    }
  EXPECT_EQ(testing::to_double(kc.narrow(0, 0, 1).contiguous()),
            std::vector<double>(size_t(kGroups * 4 * kDim), 0.0));
}

TEST(KvCache, RejectsBadArguments) {
  AttentionShape sh;
  sh.heads = kHeads;
  sh.groups = kGroups;
  sh.head_dim = kDim;
  Tensor kc = Tensor::zeros({2, kGroups, 4, kDim}, DType::F32), vc = kc.clone();
  Tensor qkv = randn({2, kWidth}, 420), ctx = Tensor::empty({2, kCtx}, DType::F32);
  auto ints = [](std::vector<int32_t> v) { return Tensor::from_vector(v, {int64_t(v.size())}); };
  EXPECT_NO_THROW(cached_attention(ctx, qkv, kc, vc, ints({0, 1}), ints({0, 3}), -1, false));
  EXPECT_THROW(kv_cache_append(kc, vc, qkv, ints({0, 2}), ints({0, 1}), sh), InternalError);
  EXPECT_THROW(kv_cache_append(kc, vc, qkv, ints({0, 1}), ints({0, 4}), sh), InternalError);
  EXPECT_THROW(kv_cache_append(kc, vc, qkv, ints({0}), ints({0}), sh), InternalError);
  EXPECT_THROW(kv_cache_append(kc, Tensor::zeros({2, kGroups, 5, kDim}, DType::F32), qkv,
                               ints({0, 1}), ints({0, 1}), sh),
               InternalError);
  EXPECT_THROW(kv_cache_append(Tensor::zeros({2, 1, 4, kDim}, DType::F32),
                               Tensor::zeros({2, 1, 4, kDim}, DType::F32), qkv, ints({0, 1}),
                               ints({0, 1}), sh),
               InternalError);
  // Mixed dtypes: a bf16 cache takes bf16 rows, an fp32 cache fp32 rows.
  Tensor kc16 = Tensor::zeros({2, kGroups, 4, kDim}, DType::BF16), vc16 = kc16.clone();
  EXPECT_THROW(kv_cache_append(kc16, vc16, qkv, ints({0, 1}), ints({0, 1}), sh), InternalError);
  EXPECT_THROW(kv_cache_append(kc16, vc, qkv, ints({0, 1}), ints({0, 1}), sh), InternalError);
  EXPECT_THROW(kv_cache_append(kc, vc, as_dtype(qkv, DType::BF16), ints({0, 1}), ints({0, 1}), sh),
               InternalError);
  EXPECT_THROW(cached_attention(ctx, qkv, kc16, vc16, ints({0, 1}), ints({0, 1}), -1, false),
               InternalError);
  // A slot beyond the cache, a position beyond the key span, an output of the wrong size.
  EXPECT_THROW(cached_attention(ctx, qkv, kc, vc, ints({0, 2}), ints({0, 1}), -1, false),
               InternalError);
  EXPECT_THROW(cached_attention(ctx, qkv, kc, vc, ints({0, 1}), ints({0, 4}), -1, false),
               InternalError);
  EXPECT_THROW(cached_attention(Tensor::empty({2, kCtx - 1}, DType::F32), qkv, kc, vc,
                                ints({0, 1}), ints({0, 1}), -1, false),
               InternalError);
}

}  // namespace
}  // namespace megatron::ops
