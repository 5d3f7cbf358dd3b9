// The core attention op's bf16 kernel, backward (see cpu_attention_bf16.h): the loop of
// cpu_attention_bwd.cpp (one OpenMP task per (batch row, query group), its heads in order, query
// tiles of 64 rows against key blocks of up to 512 keys) with its five products on the bf16 unit:
//   S = scale Q K^T (when the probabilities are recomputed), dP = dO V^T,
//   dV += Pd^T dO,  dQ += scale dS K,  dK += scale dS^T Q
// The task packs its keys and values once (K^T and V^T for the scores and dP, K for dQ), each
// tile its queries and dO. dO, Pd and dS are rounded to bf16 for their products (q, k, v are bf16
// already); the softmax gradient dS = P (keep dP - D), the bias gradient and every result stay
// fp32. D = rowsum(dO * O) takes dO rounded as dP does, so that dP - D cancels where it should (a
// row that sees one key).
#include <omp.h>

#include <cmath>

#include "kernels/cpu/cpu_attention_bf16.h"

namespace megatron::ops::cpu {

namespace {

constexpr int64_t kTileRows = 64, kKeyBlock = 512;

struct Scratch {
  WorkBuffer p, pd, dp, keep, delta;
  // The sequence's K^T, V^T [d/2, skv] and K [skv/2, d]; the tile's Q and dO along d [rows, d/2]
  // and along the rows [rows/2, d]; P (or Pd) and dS along the rows [rows/2, block] and dS along
  // the keys [rows, block/2 + 1].
  PairBuffer kt, vt, kr, qa, doa, qr, dor, pr, dsr, dsa;
  std::vector<int64_t> lo, hi;
  Scratch(int64_t rows, int64_t block, int64_t sq, int64_t skv, int64_t d)
      : p(rows * block), pd(rows * block), dp(rows * block), keep(block), delta(sq),
        kt(pairs_of(d) * pair_ld(skv)), vt(pairs_of(d) * pair_ld(skv)), kr(pairs_of(skv) * d),
        qa(rows * pairs_of(d)), doa(rows * pairs_of(d)), qr(pairs_of(rows) * d),
        dor(pairs_of(rows) * d), pr(pairs_of(rows) * pair_ld(block)), dsr(pairs_of(rows) * pair_ld(block)),
        dsa(rows * (block / 2 + 1)), lo(size_t(rows)), hi(size_t(rows)) {}
};

struct Backward {
  const AttentionPlan& P;
  const Bf16BackwardArgs& a;
  const DropoutSpec& dropout;
  Philox rng;
  int64_t ctx_width;

  void run_task(int64_t bi, int grp, Scratch& w) const {
    const int64_t sq = P.sq, skv = P.skv, d = P.d, dpairs = pairs_of(d);
    const int64_t q_ld = P.q.L.row_stride, k_ld = P.k.L.row_stride, v_ld = P.v.L.row_stride;
    const int64_t kld = pair_ld(skv);  // of K^T and V^T
    pack_pairs_cols_t(w.kt.data(), kld, P.k.at16(bi, 0, grp), k_ld, skv, d);
    pack_pairs_cols_t(w.vt.data(), kld, P.v.at16(bi, 0, grp), v_ld, skv, d);
    pack_pairs_rows(w.kr.data(), d, P.k.at16(bi, 0, grp), k_ld, skv, d);
    if (!a.accumulate)
      for (int64_t j = 0; j < skv; ++j) {
        std::fill_n(a.dk.at(bi, j, grp), d, 0.0f);
        std::fill_n(a.dv.at(bi, j, grp), d, 0.0f);
      }
    for (int hh = 0; hh < P.hpg; ++hh) {
      const int h = grp * P.hpg + hh;
      const float slope = P.slopes.empty() ? 0.0f : P.slopes[size_t(h)];
      const float* dO_b = a.dout + bi * sq * ctx_width + int64_t(h) * d;
      const float* O_b = a.out + bi * sq * ctx_width + int64_t(h) * d;
      for (int64_t i = 0; i < sq; ++i) {
        const float* go = dO_b + i * ctx_width;
        const float* o = O_b + i * ctx_width;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t e = 0; e < d; ++e) s += bf16_to_float(float_to_bf16(go[e])) * o[e];
        w.delta.data()[i] = s;
      }
      const float* lrow = a.lse + (bi * P.n + h) * sq;
      for (int64_t t0 = 0; t0 < sq; t0 += kTileRows) {
        const int64_t nt = std::min(kTileRows, sq - t0), ntpairs = pairs_of(nt);
        int64_t k0 = skv, k1 = 0;
        for (int64_t t = 0; t < nt; ++t) {
          int64_t& lo = w.lo[size_t(t)];
          int64_t& hi = w.hi[size_t(t)];
          P.key_range(bi, t0 + t, lo, hi);
          if (lrow[t0 + t] == kNegInf) hi = lo;  // the row saw no key: no gradient
          if (hi > lo) {
            k0 = std::min(k0, lo);
            k1 = std::max(k1, hi);
          }
        }
        float* dQ = a.dq.at(bi, t0, h);
        const int64_t ldq = a.dq.L.row_stride;
        if (k1 <= k0) {
          if (!a.accumulate)
            for (int64_t t = 0; t < nt; ++t) std::fill_n(dQ + t * ldq, d, 0.0f);
          continue;
        }
        const bf16* Q = P.q.at16(bi, t0, h);
        const float* dO = dO_b + t0 * ctx_width;
        pack_pairs_cols(w.qa.data(), dpairs, Q, q_ld, nt, d);
        pack_pairs_cols(w.doa.data(), dpairs, dO, ctx_width, nt, d);
        pack_pairs_rows(w.qr.data(), d, Q, q_ld, nt, d);
        pack_pairs_rows(w.dor.data(), d, dO, ctx_width, nt, d);
        for (int64_t b0 = k0; b0 < k1; b0 += kKeyBlock) {
          const int64_t b1 = std::min(k1, b0 + kKeyBlock), bw = b1 - b0;
          const float* Pr = w.p.data();
          int64_t ldp = bw;
          if (a.probs) {
            Pr = a.probs + ((bi * P.n + h) * sq + t0) * skv + b0;
            ldp = skv;
          } else {
            gemm_bf16_pairs(nt, bw, dpairs, P.scale, {w.qa.data(), dpairs, 1}, w.kt.data() + b0,
                            kld, 0.0f, w.p.data(), bw);
            recompute_probs(P, w.p.data(), bi, h, t0, nt, b0, b1, slope, lrow, w.lo.data(),
                            w.hi.data());
          }
          // dP = dO V^T, then dS in place of dP; Pd (dropout) for dV.
          float* dP = w.dp.data();
          gemm_bf16_pairs(nt, bw, dpairs, 1.0f, {w.doa.data(), dpairs, 1}, w.vt.data() + b0, kld,
                          0.0f, dP, bw);
          const float* A = Pr;
          int64_t lda = ldp;
          if (dropout.active()) {
            A = w.pd.data();
            lda = bw;
          }
          softmax_grad_block(P, {dP, Pr, ldp, dropout.active() ? w.pd.data() : nullptr,
                                 w.delta.data() + t0, w.keep.data(), w.lo.data(), w.hi.data()},
                             bi, h, t0, nt, b0, b1, dropout, rng, a.dbias, a.dbias_per_row);
          const float beta = b0 == k0 && !a.accumulate ? 0.0f : 1.0f;
          // dV += Pd^T dO and dK += scale dS^T Q: the reduction runs over the tile's rows.
          const int64_t bld = pair_ld(bw);
          pack_pairs_rows(w.pr.data(), bld, A, lda, nt, bw);
          gemm_bf16_pairs(bw, d, ntpairs, 1.0f, {w.pr.data(), 1, bld}, w.dor.data(), d, 1.0f,
                          a.dv.at(bi, b0, grp), a.dv.L.row_stride);
          pack_pairs_rows(w.dsr.data(), bld, dP, bw, nt, bw);
          gemm_bf16_pairs(bw, d, ntpairs, P.scale, {w.dsr.data(), 1, bld}, w.qr.data(), d, 1.0f,
                          a.dk.at(bi, b0, grp), a.dk.L.row_stride);
          // dQ += scale dS K: over the block's keys, from the even key at or before b0.
          const int lead = int(b0 & 1);
          const int64_t kpairs = pairs_of(bw + lead);
          pack_pairs_cols(w.dsa.data(), kpairs, dP, bw, nt, bw, lead);
          gemm_bf16_pairs(nt, d, kpairs, P.scale, {w.dsa.data(), kpairs, 1},
                          w.kr.data() + (b0 - lead) / 2 * d, d, beta, dQ, ldq);
        }
      }
    }
  }
};

}  // namespace

void attention_bwd_bf16(const AttentionPlan& P, const Bf16BackwardArgs& args,
                        const DropoutSpec& dropout) {
  const Backward bw{P, args, dropout, Philox(dropout.seed, dropout.stream),
                    int64_t(P.n) * P.d};
  const int64_t block = std::min(kKeyBlock, std::max<int64_t>(P.skv, 1));
  const int64_t rows = std::max<int64_t>(P.sq, 1);
#pragma omp parallel
  {
    Scratch w(std::min(kTileRows, rows), block, rows, P.skv, P.d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < P.b * P.g; ++task) bw.run_task(task / P.g, int(task % P.g), w);
  }
}

}  // namespace megatron::ops::cpu
