// Causal self-attention fused per (batch, head) on the CPU: S = scale * Q K^T (sgemm on strided
// views of the fused QKV activation), causal / per-query-start mask, softmax (row log-sum-exp
// saved), Philox dropout, ctx = P V (sgemm). Only the softmax probabilities [s, s] per head are
// kept for backward, and only when the caller asks (probs defined); otherwise backward
// recomputes S from Q, K and the saved log-sum-exp (selective recompute). OpenMP over
// (batch, head) tasks with per-thread s x s workspaces; OpenBLAS single-threaded.
// The query-subset ops (context parallelism) run the same code for sq query rows at given
// positions of the sequence against all kv_seq keys (sq x kv_seq workspaces).
#include <omp.h>

#include <algorithm>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace megatron::ops {
namespace {

// sq query rows against skv key positions. Without query positions (plain self-attention) query
// row i is position i and sq == skv; with them (context parallelism) row i is position qpos[i].
struct Layout {
  int64_t b, sq, skv, width, ctx_width;
  int n, g, hpg, d;
  int head_offset, total_heads;  // dropout indexes heads globally (tensor parallelism)
  const int32_t* qpos = nullptr;
  int64_t pos(int64_t i) const { return qpos ? qpos[i] : i; }
  // First Philox element of the dropout-mask row of the query at position p (head `head`): the
  // masks of the whole skv x skv attention, whatever subset of its rows is computed here.
  uint64_t dropout_first(int64_t bi, int head, int64_t p, const DropoutSpec& d) const {
    return d.element_offset + uint64_t(((bi * total_heads + head_offset + head) * skv + p) * skv);
  }
  // Column offsets inside one token's QKV row.
  int64_t q(int head) const { return int64_t(head / hpg) * (hpg + 2) * d + int64_t(head % hpg) * d; }
  int64_t k(int group) const { return int64_t(group) * (hpg + 2) * d + int64_t(hpg) * d; }
  int64_t v(int group) const { return k(group) + d; }
};

Layout check(const char* op, const Tensor& qkv, const Tensor& ctx, const Tensor& start,
             const Tensor& query_positions, const AttentionShape& sh) {
  cpu::require_f32(op, "qkv", qkv);
  cpu::require_f32(op, "ctx", ctx);
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0, op, ": heads ", sh.heads,
           " not a multiple of groups ", sh.groups);
  const int total = sh.total_heads > 0 ? sh.total_heads : sh.heads;
  MG_CHECK(sh.head_offset >= 0 && sh.head_offset + sh.heads <= total, op, ": heads [",
           sh.head_offset, ", ", sh.head_offset + sh.heads, ") outside the layer's ", total);
  const int64_t skv = query_positions.defined() ? sh.kv_seq : sh.seq;
  Layout L{sh.batch, sh.seq, skv, 0, 0, sh.heads, sh.groups, sh.heads / sh.groups, sh.head_dim,
           sh.head_offset, total};
  L.width = int64_t(L.g) * (L.hpg + 2) * L.d;
  L.ctx_width = int64_t(L.n) * L.d;
  if (query_positions.defined()) {
    cpu::require_cpu(op, query_positions);
    MG_CHECK(query_positions.dtype() == DType::I32 && query_positions.numel() == L.sq &&
                 query_positions.is_contiguous(),
             op, ": query_positions must be contiguous int32 [seq]");
    MG_CHECK(skv >= L.sq, op, ": kv_seq ", skv, " < seq ", L.sq);
    L.qpos = query_positions.data<int32_t>();
    for (int64_t i = 0; i < L.sq; ++i)
      MG_CHECK(L.qpos[i] >= 0 && L.qpos[i] < skv, op, ": query position ", L.qpos[i],
               " outside [0, ", skv, ")");
  } else {
    MG_CHECK(sh.kv_seq == 0 || sh.kv_seq == sh.seq, op, ": kv_seq needs query_positions");
  }
  MG_CHECK(qkv.numel() == L.b * L.skv * L.width, op, ": qkv ", shape_str(qkv.shape()),
           " does not match b=", L.b, " s=", L.skv, " width=", L.width);
  MG_CHECK(ctx.numel() == L.b * L.sq * L.ctx_width, op, ": ctx size mismatch");
  if (start.defined()) {
    MG_CHECK(start.dtype() == DType::I32 && start.numel() == L.b * L.sq, op,
             ": attention_start must be int32 [b, s]");
    const int32_t* st = start.data<int32_t>();
    for (int64_t i = 0; i < L.b * L.sq; ++i)
      MG_CHECK(st[i] >= 0 && st[i] <= L.pos(i % L.sq), op, ": attention_start[", i, "] = ", st[i],
               " must lie in [0, position]");
  }
  return L;
}

inline int32_t row_start(const int32_t* st, int64_t bi, int64_t sq, int64_t i) {
  return st ? st[bi * sq + i] : 0;
}

// S (scaled scores, [sq, skv]) -> P (softmax over keys start..p, zeros elsewhere), lse per row.
void softmax_rows(float* P, float* lse, const int32_t* st, int64_t bi, const Layout& L) {
  const int64_t s = L.skv;
  for (int64_t i = 0; i < L.sq; ++i) {
    float* row = P + i * s;
    const int64_t j0 = row_start(st, bi, L.sq, i), p = L.pos(i);
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = j0; j <= p; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (int64_t j = j0; j <= p; ++j) {
      row[j] = cpu::fast_exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < j0; ++j) row[j] = 0;
    for (int64_t j = j0; j <= p; ++j) row[j] *= inv;
    for (int64_t j = p + 1; j < s; ++j) row[j] = 0;
    lse[i] = mx + std::log(sum);
  }
}

// P from S and the saved lse (backward recompute).
void softmax_from_lse(float* P, const float* lse, const int32_t* st, int64_t bi, const Layout& L) {
  const int64_t s = L.skv;
  for (int64_t i = 0; i < L.sq; ++i) {
    float* row = P + i * s;
    const int64_t j0 = row_start(st, bi, L.sq, i), p = L.pos(i);
    for (int64_t j = 0; j < s; ++j) row[j] = (j >= j0 && j <= p) ? cpu::fast_exp(row[j] - lse[i]) : 0;
  }
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// Pd = P * keep for head (bi, head); returns Pd (== P when dropout is off).
const float* apply_dropout(float* Pd, const float* P, const Layout& L, int64_t bi, int head,
                           const DropoutSpec& d, const Philox& rng, std::vector<float>& keep) {
  if (!d.active()) return P;
  const int64_t s = L.skv;
  for (int64_t i = 0; i < L.sq; ++i) {
    const int64_t p = L.pos(i);
    cpu::dropout_row(keep.data(), p + 1, L.dropout_first(bi, head, p, d), rng, d.p);  // keys > p are zero anyway
    for (int64_t j = 0; j <= p; ++j) Pd[i * s + j] = P[i * s + j] * keep[size_t(j)];
    for (int64_t j = p + 1; j < s; ++j) Pd[i * s + j] = 0;
  }
  return Pd;
}

// Head `head`'s query rows: a strided view of qkv, or (query subset) copied into buf [sq, d].
const float* query_rows(const Layout& L, const float* base, int head, float* buf, int64_t& ld) {
  if (!L.qpos) {
    ld = L.width;
    return base + L.q(head);
  }
  for (int64_t i = 0; i < L.sq; ++i) {
    const float* src = base + L.qpos[i] * L.width + L.q(head);
    std::copy(src, src + L.d, buf + i * L.d);
  }
  ld = L.d;
  return buf;
}

void forward(const Layout& L, const Tensor& ctx, const Tensor& lse, const Tensor& probs,
             const Tensor& qkv, const Tensor& attention_start, float scale,
             const DropoutSpec& dropout) {
  cpu::require_f32("attention_fwd", "lse", lse);
  MG_CHECK(lse.numel() == L.b * L.n * L.sq, "attention_fwd: lse must be [b, n, s]");
  const int64_t sq = L.sq, skv = L.skv;
  if (probs.defined()) {
    cpu::require_f32("attention_fwd", "probs", probs);
    MG_CHECK(probs.numel() == L.b * L.n * sq * skv, "attention_fwd: probs must be [b, n, s, kv_s]");
  }
  const float* x = qkv.data<float>();
  float* out = ctx.data<float>();
  float* lp = lse.data<float>();
  float* pp = probs.defined() ? probs.data<float>() : nullptr;
  const int32_t* st = attention_start.defined() ? attention_start.data<int32_t>() : nullptr;
  const Philox rng(dropout.seed, dropout.stream);
  cpu::blas_single_threaded();
#pragma omp parallel
  {
    std::vector<float> work(size_t(sq * skv) * (pp ? 1 : 2)), keep(static_cast<size_t>(skv));
    std::vector<float> qbuf(L.qpos ? size_t(sq * L.d) : 0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.n; ++task) {
      const int64_t bi = task / L.n;
      const int head = int(task % L.n);
      const float* base = x + bi * skv * L.width;
      float* P = pp ? pp + task * sq * skv : work.data();
      float* Pd = pp ? work.data() : work.data() + sq * skv;
      int64_t ldq = 0;
      const float* Q = query_rows(L, base, head, qbuf.data(), ldq);
      sgemm(false, true, sq, skv, L.d, scale, Q, ldq, base + L.k(head / L.hpg), L.width, 0.0f, P,
            skv);
      softmax_rows(P, lp + task * sq, st, bi, L);
      const float* A = apply_dropout(Pd, P, L, bi, head, dropout, rng, keep);
      sgemm(false, false, sq, L.d, skv, 1.0f, A, skv, base + L.v(head / L.hpg), L.width, 0.0f,
            out + bi * sq * L.ctx_width + int64_t(head) * L.d, L.ctx_width);
    }
  }
}

void backward(const Layout& L, const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
              const Tensor& lse, const Tensor& probs, const Tensor& attention_start, float sc,
              const DropoutSpec& dropout) {
  cpu::require_f32("attention_bwd", "dqkv", dqkv);
  cpu::require_numel("attention_bwd", dqkv, qkv);
  const int64_t sq = L.sq, skv = L.skv;
  const float* x = qkv.data<float>();
  const float* dout = dctx.data<float>();
  float* dx = dqkv.data<float>();
  const float* lp = lse.data<float>();
  const float* pp = probs.defined() ? probs.data<float>() : nullptr;
  const int32_t* st = attention_start.defined() ? attention_start.data<int32_t>() : nullptr;
  const Philox rng(dropout.seed, dropout.stream);
  // A query subset writes dQ only at its rows: the query columns of the other rows are zero.
  if (L.qpos) std::fill(dx, dx + dqkv.numel(), 0.0f);
  cpu::blas_single_threaded();
  // One task per (batch, query group): heads of a group share dK, dV, so they run in order.
#pragma omp parallel
  {
    std::vector<float> work(size_t(sq * skv) * 3), keep(static_cast<size_t>(skv));
    std::vector<float> qbuf(L.qpos ? size_t(sq * L.d) : 0), dqbuf(qbuf.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.g; ++task) {
      const int64_t bi = task / L.g;
      const int group = int(task % L.g);
      const float* base = x + bi * skv * L.width;
      float* dbase = dx + bi * skv * L.width;
      const float* dO_b = dout + bi * sq * L.ctx_width;
      for (int hh = 0; hh < L.hpg; ++hh) {
        const int head = group * L.hpg + hh;
        const int64_t hidx = bi * L.n + head;
        float* P = work.data();
        float* Pd = work.data() + sq * skv;
        float* dP = work.data() + 2 * sq * skv;
        int64_t ldq = 0;
        const float* Q = query_rows(L, base, head, qbuf.data(), ldq);
        if (pp) {
          std::copy(pp + hidx * sq * skv, pp + (hidx + 1) * sq * skv, P);
        } else {
          sgemm(false, true, sq, skv, L.d, sc, Q, ldq, base + L.k(group), L.width, 0.0f, P, skv);
          softmax_from_lse(P, lp + hidx * sq, st, bi, L);
        }
        const float* A = apply_dropout(Pd, P, L, bi, head, dropout, rng, keep);
        const float* dO = dO_b + int64_t(head) * L.d;
        const float beta = hh == 0 ? 0.0f : 1.0f;
        // dV += Pd^T dO
        sgemm(true, false, skv, L.d, sq, 1.0f, A, skv, dO, L.ctx_width, beta, dbase + L.v(group),
              L.width);
        // dPd = dO V^T
        sgemm(false, true, sq, skv, L.d, 1.0f, dO, L.ctx_width, base + L.v(group), L.width, 0.0f,
              dP, skv);
        for (int64_t i = 0; i < sq; ++i) {
          float* dpr = dP + i * skv;
          const float* pr = P + i * skv;
          const int64_t p = L.pos(i);
          if (dropout.active()) {
            cpu::dropout_row(keep.data(), p + 1, L.dropout_first(bi, head, p, dropout), rng,
                             dropout.p);
            for (int64_t j = 0; j <= p; ++j) dpr[j] *= keep[size_t(j)];
          }
          float D = 0;
          for (int64_t j = 0; j <= p; ++j) D += pr[j] * dpr[j];
          for (int64_t j = 0; j <= p; ++j) dpr[j] = pr[j] * (dpr[j] - D);
          for (int64_t j = p + 1; j < skv; ++j) dpr[j] = 0;
        }
        // dQ = sc * dS K ; dK += sc * dS^T Q
        if (L.qpos) {
          sgemm(false, false, sq, L.d, skv, sc, dP, skv, base + L.k(group), L.width, 0.0f,
                dqbuf.data(), L.d);
          for (int64_t i = 0; i < sq; ++i)
            std::copy(dqbuf.data() + i * L.d, dqbuf.data() + (i + 1) * L.d,
                      dbase + L.qpos[i] * L.width + L.q(head));
        } else {
          sgemm(false, false, sq, L.d, skv, sc, dP, skv, base + L.k(group), L.width, 0.0f,
                dbase + L.q(head), L.width);
        }
        sgemm(true, false, skv, L.d, sq, sc, dP, skv, Q, ldq, beta, dbase + L.k(group), L.width);
      }
    }
  }
}

}  // namespace

void attention_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs, const Tensor& qkv,
                   const Tensor& attention_start, const AttentionShape& shape,
                   const DropoutSpec& dropout) {
  const Layout L = check("attention_fwd", qkv, ctx, attention_start, Tensor(), shape);
  forward(L, ctx, lse, probs, qkv, attention_start, shape.softmax_scale, dropout);
}

void attention_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& lse,
                   const Tensor& probs, const Tensor& attention_start,
                   const AttentionShape& shape, const DropoutSpec& dropout) {
  const Layout L = check("attention_bwd", qkv, dctx, attention_start, Tensor(), shape);
  backward(L, dqkv, dctx, qkv, lse, probs, attention_start, shape.softmax_scale, dropout);
}

void attention_subset_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs,
                          const Tensor& qkv, const Tensor& query_positions,
                          const Tensor& attention_start, const AttentionShape& shape,
                          const DropoutSpec& dropout) {
  MG_CHECK(query_positions.defined(), "attention_subset_fwd: query_positions is undefined");
  const Layout L = check("attention_subset_fwd", qkv, ctx, attention_start, query_positions, shape);
  forward(L, ctx, lse, probs, qkv, attention_start, shape.softmax_scale, dropout);
}

void attention_subset_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                          const Tensor& query_positions, const Tensor& lse, const Tensor& probs,
                          const Tensor& attention_start, const AttentionShape& shape,
                          const DropoutSpec& dropout) {
  MG_CHECK(query_positions.defined(), "attention_subset_bwd: query_positions is undefined");
  const Layout L = check("attention_subset_bwd", qkv, dctx, attention_start, query_positions, shape);
  backward(L, dqkv, dctx, qkv, lse, probs, attention_start, shape.softmax_scale, dropout);
}

}  // namespace megatron::ops
