// The core attention op on the CPU, backward (see cpu_attention.cpp for the forward), flash
// style: per query tile and key block the probabilities come from the saved probs or are
// recomputed from Q, K and the saved log-sum-exp, and
//   dV += Pd^T dO,  dS = P (keep dO V^T - D),  dQ += scale dS K,  dK += scale dS^T Q
// with D = rowsum(dO * O) (the final output: for ring blocks, the merged one) and Pd = P * keep
// (dropout). One OpenMP task per (batch row, query group): the group's heads share dK and dV, so
// they run in order inside the task. A bias gradient broadcast over the batch is summed from
// per-batch-row parts in a fixed order, so results do not depend on the thread count.
#include <omp.h>

#include <cmath>

#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/cpu/cpu_attention_common.h"

namespace megatron::ops::cpu {

void recompute_probs(const AttentionPlan& P, float* S, int64_t bi, int h, int64_t t0, int64_t nt,
                     int64_t b0, int64_t b1, float slope, const float* lrow, const int64_t* lo,
                     const int64_t* hi) {
  const int64_t bw = b1 - b0;
  const int32_t* pad = P.pad_row(bi);
  for (int64_t t = 0; t < nt; ++t) {
    float* row = S + t * bw;
    const int64_t v0 = std::max(lo[t], b0), v1 = std::min(hi[t], b1);
    if (v1 <= v0) {
      std::fill_n(row, bw, 0.0f);
      continue;
    }
    const int64_t p = P.q_position(bi, t0 + t);
    add_score_terms(P, row, b0, v0, v1, P.bias_row(bi, h, p), slope, p);
    const float m = lrow[t0 + t];
    float* r = row - b0;
    std::fill(row, r + v0, 0.0f);
    if (pad) {
      for (int64_t j = v0; j < v1; ++j) r[j] = pad[P.k_position(j)] != 0 ? fast_exp(r[j] - m) : 0.0f;
    } else {
#pragma omp simd
      for (int64_t j = v0; j < v1; ++j) r[j] = fast_exp(r[j] - m);
    }
    std::fill(r + v1, row + bw, 0.0f);
  }
}

void softmax_grad_block(const AttentionPlan& P, const GradBlock& g, int64_t bi, int h, int64_t t0,
                        int64_t nt, int64_t b0, int64_t b1, const DropoutSpec& dropout,
                        const Philox& rng, float* dbias, bool dbias_per_row) {
  const int64_t bw = b1 - b0;
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t v0 = std::max(g.lo[t], b0), v1 = std::min(g.hi[t], b1);
    float* ds = g.dp + t * bw - b0;  // ds[j]: key row j
    const float* pr = g.probs + t * g.ldp - b0;
    float* pd = g.pd ? g.pd + t * bw - b0 : nullptr;
    if (v1 <= v0) {
      std::fill_n(g.dp + t * bw, bw, 0.0f);
      if (pd) std::fill_n(g.pd + t * bw, bw, 0.0f);
      continue;
    }
    const int64_t p = P.q_position(bi, t0 + t);
    if (pd) {
      dropout_keep(P, g.keep, v0, v1, P.dropout_first(bi, h, p, dropout), rng, dropout.p);
      const float* keep = g.keep - v0;
      std::fill(pd + b0, pd + v0, 0.0f);
      for (int64_t j = v0; j < v1; ++j) {
        pd[j] = pr[j] * keep[j];
        ds[j] *= keep[j];
      }
      std::fill(pd + v1, pd + b1, 0.0f);
    }
    const float D = g.delta[t];
    std::fill(ds + b0, ds + v0, 0.0f);
#pragma omp simd
    for (int64_t j = v0; j < v1; ++j) ds[j] = pr[j] * (ds[j] - D);
    std::fill(ds + v1, ds + b1, 0.0f);
    if (dbias) {
      const int64_t bb = dbias_per_row || P.bias_batch != 1 ? bi : 0;
      float* db = dbias + ((bb * P.n + h) * P.q_span + p) * P.kv_span;
      for (int64_t j = v0; j < v1; ++j) db[P.k_position(j)] += ds[j];
    }
  }
}

namespace {

constexpr int64_t kTileRows = 64, kKeyBlock = 512;

struct Scratch {
  WorkBuffer p, pd, dp, keep, delta;
  std::vector<int64_t> lo, hi;
  // Tiles of up to `rows` query rows against key blocks of up to `block` keys; sq rows of D.
  Scratch(int64_t rows, int64_t block, int64_t sq)
      : p(rows * block), pd(rows * block), dp(rows * block), keep(block), delta(sq),
        lo(size_t(rows)), hi(size_t(rows)) {}
};

struct Backward {
  const AttentionPlan& P;
  HeadOperand dq, dk, dv;
  const float* dout;
  const float* out;
  const float* lse;
  const float* probs;
  float* dbias;  // this call's target: dbias itself, or per-batch-row parts
  bool dbias_per_row;
  const DropoutSpec& dropout;
  Philox rng;
  int64_t ctx_width;
  bool accumulate;

  void run_task(int64_t bi, int grp, Scratch& w) const {
    const int64_t sq = P.sq, skv = P.skv, d = P.d;
    if (!accumulate)
      for (int64_t j = 0; j < skv; ++j) {
        std::fill_n(dk.at(bi, j, grp), d, 0.0f);
        std::fill_n(dv.at(bi, j, grp), d, 0.0f);
      }
    for (int hh = 0; hh < P.hpg; ++hh) {
      const int h = grp * P.hpg + hh;
      const float slope = P.slopes.empty() ? 0.0f : P.slopes[size_t(h)];
      const float* dO_b = dout + bi * sq * ctx_width + int64_t(h) * d;
      const float* O_b = out + bi * sq * ctx_width + int64_t(h) * d;
      for (int64_t i = 0; i < sq; ++i) {
        const float* go = dO_b + i * ctx_width;
        const float* o = O_b + i * ctx_width;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t e = 0; e < d; ++e) s += go[e] * o[e];
        w.delta.data()[i] = s;
      }
      const float* lrow = lse + (bi * P.n + h) * sq;
      for (int64_t t0 = 0; t0 < sq; t0 += kTileRows) {
        const int64_t nt = std::min(kTileRows, sq - t0);
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
        float* dQ = dq.at(bi, t0, h);
        const int64_t ldq = dq.L.row_stride;
        if (k1 <= k0) {
          if (!accumulate)
            for (int64_t t = 0; t < nt; ++t) std::fill_n(dQ + t * ldq, d, 0.0f);
          continue;
        }
        const float* Q = P.q.at(bi, t0, h);
        const float* dO = dO_b + t0 * ctx_width;
        for (int64_t b0 = k0; b0 < k1; b0 += kKeyBlock) {
          const int64_t b1 = std::min(k1, b0 + kKeyBlock), bw = b1 - b0;
          const float* K = P.k.at(bi, b0, grp);
          const float* V = P.v.at(bi, b0, grp);
          const float* Pr = w.p.data();
          int64_t ldp = bw;
          if (probs) {
            Pr = probs + ((bi * P.n + h) * sq + t0) * skv + b0;
            ldp = skv;
          } else {
            float* S = w.p.data();
            sgemm(false, true, nt, bw, d, P.scale, Q, P.q.L.row_stride, K, P.k.L.row_stride, 0.0f,
                  S, bw);
            recompute_probs(P, S, bi, h, t0, nt, b0, b1, slope, lrow, w.lo.data(), w.hi.data());
          }
          // dP = dO V^T, then dS in place of dP; Pd (dropout) for dV.
          float* dP = w.dp.data();
          sgemm(false, true, nt, bw, d, 1.0f, dO, ctx_width, V, P.v.L.row_stride, 0.0f, dP, bw);
          const float* A = Pr;
          int64_t lda = ldp;
          if (dropout.active()) {
            A = w.pd.data();
            lda = bw;
          }
          softmax_grad_block(P, {dP, Pr, ldp, dropout.active() ? w.pd.data() : nullptr,
                                 w.delta.data() + t0, w.keep.data(), w.lo.data(), w.hi.data()},
                             bi, h, t0, nt, b0, b1, dropout, rng, dbias, dbias_per_row);
          const float beta = b0 == k0 && !accumulate ? 0.0f : 1.0f;
          sgemm(true, false, bw, d, nt, 1.0f, A, lda, dO, ctx_width, 1.0f, dv.at(bi, b0, grp),
                dv.L.row_stride);
          sgemm(false, false, nt, d, bw, P.scale, dP, bw, K, P.k.L.row_stride, beta, dQ, ldq);
          sgemm(true, false, bw, d, nt, P.scale, dP, bw, Q, P.q.L.row_stride, 1.0f,
                dk.at(bi, b0, grp), dk.L.row_stride);
        }
      }
    }
  }
};

}  // namespace

void attention_bwd(const AttentionGrads& grads, const Tensor& dout, const Tensor& out,
                   const Tensor& lse, const Tensor& probs, const AttentionInputs& in,
                   const AttentionMask& mask, const AttentionShape& shape,
                   const DropoutSpec& dropout, bool accumulate) {
  const char* op = "attention_bwd";
  const AttentionPlan P = make_plan(op, in, mask, shape);
  MG_CHECK(P.kv_index == nullptr, op, ": kv_index (KV-cache attention) has no backward");
  const int64_t ctx_width = int64_t(P.n) * P.d;
  require_shape(op, "dout", dout, P.b * P.sq * ctx_width);
  require_shape(op, "out", out, P.b * P.sq * ctx_width);
  require_shape(op, "lse", lse, P.b * P.n * P.sq);
  if (probs.defined()) require_shape(op, "probs", probs, P.b * P.n * P.sq * P.skv);
  const HeadOperand dq = grad_operand(op, "dq", grads.dq, in.q_layout, P.b, P.sq, P.n, P.d);
  const HeadOperand dk = grad_operand(op, "dk", grads.dk, in.k_layout, P.b, P.skv, P.g, P.d);
  const HeadOperand dv = grad_operand(op, "dv", grads.dv, in.v_layout, P.b, P.skv, P.g, P.d);
  float* dbias = nullptr;
  std::vector<float> parts;  // per-batch-row bias gradients when the bias is broadcast
  const bool per_row = grads.dbias.defined() && P.bias_batch == 1 && P.b > 1;
  if (grads.dbias.defined()) {
    MG_CHECK(P.bias != nullptr, op, ": dbias without a bias");
    require_shape(op, "dbias", grads.dbias, in.bias.numel());
    if (!accumulate) std::fill_n(grads.dbias.data<float>(), grads.dbias.numel(), 0.0f);
    if (per_row) {
      parts.assign(size_t(P.b * in.bias.numel()), 0.0f);
      dbias = parts.data();
    } else {
      dbias = grads.dbias.data<float>();
    }
  }
  const float* probs_p = probs.defined() ? probs.data<float>() : nullptr;
  if (P.q.base16) {
    attention_bwd_bf16(P, {dq, dk, dv, dout.data<float>(), out.data<float>(), lse.data<float>(),
                           probs_p, dbias, per_row, accumulate}, dropout);
  } else {
    const Backward bw{P, dq, dk, dv, dout.data<float>(), out.data<float>(), lse.data<float>(),
                      probs_p, dbias, per_row, dropout, Philox(dropout.seed, dropout.stream),
                      ctx_width, accumulate};
    const int64_t block = std::min(kKeyBlock, std::max<int64_t>(P.skv, 1));
    const int64_t rows = std::max<int64_t>(P.sq, 1);
    blas_single_threaded();
#pragma omp parallel
    {
      Scratch w(std::min(kTileRows, rows), block, rows);
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < P.b * P.g; ++task) bw.run_task(task / P.g, int(task % P.g), w);
    }
  }
  if (per_row) {  // sum the parts in batch order
    float* db = grads.dbias.data<float>();
    const int64_t n = grads.dbias.numel();
    parallel_for(n, n * P.b, [&](int64_t e) {
      float s = db[e];
      for (int64_t bi = 0; bi < P.b; ++bi) s += parts[size_t(bi * n + e)];
      db[e] = s;
    });
  }
}

}  // namespace megatron::ops::cpu
