// The core attention op's bf16 kernel, forward (see cpu_attention_bf16.h; the backward is in
// cpu_attention_bf16_bwd.cpp). The loop is that of cpu_attention.cpp: query tiles of 64 rows
// against key blocks of up to 512 keys (the whole visible range when probabilities are saved),
// online softmax in fp32, one OpenMP task per (run of query rows, head). Per task the keys (as
// K^T) and values of the sequence are packed once into bf16 pairs, per tile the queries; S = scale
// Q K^T and O += P V run on the bf16 unit, P rounded to bf16 after dropout (a block starting at an
// odd key is read from the even key before it, with a zero probability there). Runs of fewer than
// kMinPackRows query rows (decoding) read the bf16 keys and values in place, row by row, on the
// same unit (cpu_bf16_decode.cpp).
#include <omp.h>

#include <cmath>

#include "kernels/cpu/cpu_attention_bf16.h"

namespace megatron::ops::cpu {

namespace {

constexpr int64_t kTileRows = 64, kKeyBlock = 512, kMinPackRows = 4;

struct Scratch {
  WorkBuffer s, pd, keep;
  PairBuffer kt, vp, qa, pa;  // K^T [d/2, skv], V [skv/2, d], Q tile [rows, d/2], P [rows, *]
  std::vector<bf16> p16;  // one row's probabilities (decoding)
  std::vector<float> m, l;
  std::vector<int64_t> lo, hi;
  Scratch(int64_t rows, int64_t block, int64_t skv, int64_t d, bool pack)
      : s(rows * block), pd(rows * block), keep(block), kt(pack ? pairs_of(d) * pair_ld(skv) : 0),
        vp(pack ? pairs_of(skv) * d : 0), qa(rows * pairs_of(d)), pa(rows * (block / 2 + 1)),
        p16(size_t(block)), m(size_t(rows)), l(size_t(rows)), lo(size_t(rows)), hi(size_t(rows)) {}
};

struct Forward {
  const AttentionPlan& P;
  float* out;
  float* lse;
  float* probs;
  const DropoutSpec& dropout;
  Philox rng;
  int64_t ctx_width;

  static int64_t row_bi(const Run& r, int64_t t, int64_t sq) { return sq == 1 ? r.bi + t : r.bi; }
  static int64_t row_i(const Run& r, int64_t t, int64_t sq) { return sq == 1 ? 0 : r.i0 + t; }

  void softmax_row(float* row, int64_t b0, int64_t bw, int64_t v0, int64_t v1, int64_t bi,
                   int h, int64_t i, float slope, float& m, float& l, float* o,
                   bool later_block) const {
    online_softmax_step(P, row, b0, bw, v0, v1, bi, h, i, slope, m, l, o, later_block);
  }

  void run_task(const Run& run, int h, Scratch& w) const {
    const int64_t sq = P.sq, kvs = P.kv_seq_of(run.bi), d = P.d, dpairs = pairs_of(d);
    const int grp = h / P.hpg;
    const int64_t q_ld = sq == 1 ? P.q.L.seq_stride : P.q.L.row_stride;
    const int64_t k_ld = P.k.L.row_stride, v_ld = P.v.L.row_stride;
    const int64_t p_ld = sq == 1 ? int64_t(P.n) * P.skv : P.skv;  // probs rows
    const float slope = P.slopes.empty() ? 0.0f : P.slopes[size_t(h)];
    const bool packed = run.rows >= kMinPackRows;
    if (packed) {  // the sequence's keys and values, once per task
      // Only the keys some row of the run can see: a KV cache's later positions are not written
      // yet (any bits, NaN too), and a pair's zero probability must not meet one of them.
      int64_t kmax = 0;
      for (int64_t t = 0; t < run.rows; ++t) {
        int64_t lo = 0, hi = 0;
        P.key_range(row_bi(run, t, sq), row_i(run, t, sq), lo, hi);
        if (hi > lo) kmax = std::max(kmax, hi);
      }
      pack_pairs_cols_t(w.kt.data(), pair_ld(P.skv), P.k.at16(kvs, 0, grp), k_ld, kmax, d);
      pack_pairs_rows(w.vp.data(), d, P.v.at16(kvs, 0, grp), v_ld, kmax, d);
    }
    const int64_t tile = packed ? kTileRows : 1;
    for (int64_t t0 = 0; t0 < run.rows; t0 += tile) {
      const int64_t nt = std::min(tile, run.rows - t0);
      int64_t k0 = P.skv, k1 = 0;
      for (int64_t t = 0; t < nt; ++t) {
        int64_t& lo = w.lo[size_t(t)];
        int64_t& hi = w.hi[size_t(t)];
        P.key_range(row_bi(run, t0 + t, sq), row_i(run, t0 + t, sq), lo, hi);
        if (hi > lo) {
          k0 = std::min(k0, lo);
          k1 = std::max(k1, hi);
        }
        w.m[size_t(t)] = kNegInf;
        w.l[size_t(t)] = 0.0f;
      }
      const int64_t bi0 = row_bi(run, t0, sq), i0 = row_i(run, t0, sq);
      float* O = out + (bi0 * sq + i0) * ctx_width + int64_t(h) * d;
      float* Pp = probs ? probs + ((bi0 * P.n + h) * sq + i0) * P.skv : nullptr;
      if (k1 <= k0) k0 = k1 = 0;
      const bf16* Q = P.q.at16(bi0, i0, h);
      if (packed && k1 > k0) pack_pairs_cols(w.qa.data(), dpairs, Q, q_ld, nt, d);
      const int64_t block = Pp ? std::max<int64_t>(k1 - k0, 1) : kKeyBlock;
      for (int64_t b0 = k0; b0 < k1; b0 += block) {
        const int64_t b1 = std::min(k1, b0 + block), bw = b1 - b0;
        float* S = Pp ? Pp + b0 : w.s.data();
        const int64_t ld = Pp ? p_ld : bw;
        if (packed) {
          gemm_bf16_pairs(nt, bw, dpairs, P.scale, {w.qa.data(), dpairs, 1}, w.kt.data() + b0,
                          pair_ld(P.skv), 0.0f, S, ld);
        } else {
          decode_scores_bf16(P.k.at16(kvs, b0, grp), bw, k_ld, d, Q, P.scale, S);
        }
        for (int64_t t = 0; t < nt; ++t) {
          const int64_t v0 = std::max(w.lo[size_t(t)], b0), v1 = std::min(w.hi[size_t(t)], b1);
          softmax_row(S + t * ld, b0, bw, v0, v1, row_bi(run, t0 + t, sq),
                      h, row_i(run, t0 + t, sq), slope, w.m[size_t(t)], w.l[size_t(t)],
                      O + t * ctx_width, b0 > k0);
        }
        const float* A = S;  // P, times the dropout keep factors
        int64_t lda = ld;
        if (dropout.active()) {
          dropped_probs(P, S, ld, run, t0, nt, h, b0, bw, w.lo.data(), w.hi.data(), dropout, rng,
                        w.keep.data(), w.pd.data());
          A = w.pd.data();
          lda = bw;
        }
        const float beta = b0 > k0 ? 1.0f : 0.0f;
        if (packed) {
          const int lead = int(b0 & 1);  // the pairs of V start at an even key
          const int64_t ppairs = pairs_of(bw + lead);
          pack_pairs_cols(w.pa.data(), ppairs, A, lda, nt, bw, lead);
          gemm_bf16_pairs(nt, d, ppairs, 1.0f, {w.pa.data(), ppairs, 1},
                          w.vp.data() + (b0 - lead) / 2 * d, d, beta, O, ctx_width);
        } else {  // one row: its bf16 probabilities against V as stored
          for (int64_t j = 0; j < bw; ++j) w.p16[size_t(j)] = float_to_bf16(A[j]);
          decode_values_bf16(P.v.at16(kvs, b0, grp), bw, v_ld, d, w.p16.data(), beta, O);
        }
      }
      for (int64_t t = 0; t < nt; ++t) {  // normalise; rows that saw nothing get zeros
        const int64_t bi = row_bi(run, t0 + t, sq), i = row_i(run, t0 + t, sq);
        float* o = O + t * ctx_width;
        const float l = w.l[size_t(t)];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t e = 0; e < d; ++e) o[e] = l > 0.0f ? o[e] * inv : 0.0f;
        if (lse) lse[(bi * P.n + h) * sq + i] = l > 0.0f ? w.m[size_t(t)] + std::log(l) : kNegInf;
        if (Pp) {
          float* row = Pp + t * p_ld;
          std::fill(row, row + k0, 0.0f);
          for (int64_t j = k0; j < k1; ++j) row[j] *= inv;
          std::fill(row + k1, row + P.skv, 0.0f);
        }
      }
    }
  }
};

}  // namespace

void attention_fwd_bf16(const AttentionPlan& P, const Tensor& out, const Tensor& lse,
                        const Tensor& probs, const DropoutSpec& dropout) {
  const int64_t ctx_width = int64_t(P.n) * P.d;
  const Forward f{P, out.data<float>(), lse.defined() ? lse.data<float>() : nullptr,
                  probs.defined() ? probs.data<float>() : nullptr, dropout,
                  Philox(dropout.seed, dropout.stream), ctx_width};
  const std::vector<Run> runs = make_runs(P);
  const int64_t tasks = int64_t(runs.size()) * P.n;
  int64_t rows = 1;  // the largest tile
  for (const Run& r : runs) rows = std::max(rows, std::min(kTileRows, r.rows));
  const int64_t keys = std::max<int64_t>(P.skv, 1);
  const int64_t block = probs.defined() ? keys : std::min(kKeyBlock, keys);
  bool pack = false;  // some run has enough rows to pack its keys and values
  for (const Run& r : runs) pack = pack || r.rows >= kMinPackRows;
  if (P.b * P.sq * P.skv * ctx_width <= kMinParallelWork) {  // on this thread, no OpenMP region
    Scratch w(rows, block, P.skv, P.d, pack);
    for (int64_t task = 0; task < tasks; ++task)
      f.run_task(runs[size_t(task / P.n)], int(task % P.n), w);
    return;
  }
#pragma omp parallel
  {
    Scratch w(rows, block, P.skv, P.d, pack);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task)
      f.run_task(runs[size_t(task / P.n)], int(task % P.n), w);
  }
}

}  // namespace megatron::ops::cpu
