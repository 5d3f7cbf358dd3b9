// Causal self-attention fused per (batch, head) on the CPU: S = scale * Q K^T (sgemm on strided
// views of the fused QKV activation), causal / per-query-start mask, softmax (row log-sum-exp
// saved), Philox dropout, ctx = P V (sgemm). Only the softmax probabilities [s, s] per head are
// kept for backward, and only when the caller asks (probs defined); otherwise backward
// recomputes S from Q, K and the saved log-sum-exp (selective recompute). OpenMP over
// (batch, head) tasks with per-thread s x s workspaces; OpenBLAS single-threaded.
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace megatron::ops {
namespace {

struct Layout {
  int64_t b, s, width, ctx_width;
  int n, g, hpg, d;
  int head_offset, total_heads;  // dropout indexes heads globally (tensor parallelism)
  // First Philox element of row i of head `head`'s s x s dropout mask.
  uint64_t dropout_first(int64_t bi, int head, int64_t i, const DropoutSpec& d) const {
    return d.element_offset + uint64_t(((bi * total_heads + head_offset + head) * s + i) * s);
  }
  // Column offsets inside one token's QKV row.
  int64_t q(int head) const { return int64_t(head / hpg) * (hpg + 2) * d + int64_t(head % hpg) * d; }
  int64_t k(int group) const { return int64_t(group) * (hpg + 2) * d + int64_t(hpg) * d; }
  int64_t v(int group) const { return k(group) + d; }
};

Layout check(const char* op, const Tensor& qkv, const Tensor& ctx, const Tensor& start,
             const AttentionShape& sh) {
  cpu::require_f32(op, "qkv", qkv);
  cpu::require_f32(op, "ctx", ctx);
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0, op, ": heads ", sh.heads,
           " not a multiple of groups ", sh.groups);
  const int total = sh.total_heads > 0 ? sh.total_heads : sh.heads;
  MG_CHECK(sh.head_offset >= 0 && sh.head_offset + sh.heads <= total, op, ": heads [",
           sh.head_offset, ", ", sh.head_offset + sh.heads, ") outside the layer's ", total);
  Layout L{sh.batch, sh.seq, 0, 0, sh.heads, sh.groups, sh.heads / sh.groups, sh.head_dim,
           sh.head_offset, total};
  L.width = int64_t(L.g) * (L.hpg + 2) * L.d;
  L.ctx_width = int64_t(L.n) * L.d;
  MG_CHECK(qkv.numel() == L.b * L.s * L.width, op, ": qkv ", shape_str(qkv.shape()),
           " does not match b=", L.b, " s=", L.s, " width=", L.width);
  MG_CHECK(ctx.numel() == L.b * L.s * L.ctx_width, op, ": ctx size mismatch");
  if (start.defined()) {
    MG_CHECK(start.dtype() == DType::I32 && start.numel() == L.b * L.s, op,
             ": attention_start must be int32 [b, s]");
    const int32_t* st = start.data<int32_t>();
    for (int64_t i = 0; i < L.b * L.s; ++i)
      MG_CHECK(st[i] >= 0 && st[i] <= i % L.s, op, ": attention_start[", i, "] = ", st[i],
               " must lie in [0, position]");
  }
  return L;
}

inline int32_t row_start(const int32_t* st, int64_t bi, int64_t s, int64_t i) {
  return st ? st[bi * s + i] : 0;
}

// S (scaled scores) -> P (softmax over keys start..i, zeros elsewhere), lse per row.
void softmax_rows(float* P, float* lse, const int32_t* st, int64_t bi, int64_t s) {
  for (int64_t i = 0; i < s; ++i) {
    float* row = P + i * s;
    const int64_t j0 = row_start(st, bi, s, i);
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = j0; j <= i; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (int64_t j = j0; j <= i; ++j) {
      row[j] = cpu::fast_exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < j0; ++j) row[j] = 0;
    for (int64_t j = j0; j <= i; ++j) row[j] *= inv;
    for (int64_t j = i + 1; j < s; ++j) row[j] = 0;
    lse[i] = mx + std::log(sum);
  }
}

// P from S and the saved lse (backward recompute).
void softmax_from_lse(float* P, const float* lse, const int32_t* st, int64_t bi, int64_t s) {
  for (int64_t i = 0; i < s; ++i) {
    float* row = P + i * s;
    const int64_t j0 = row_start(st, bi, s, i);
    for (int64_t j = 0; j < s; ++j) row[j] = (j >= j0 && j <= i) ? cpu::fast_exp(row[j] - lse[i]) : 0;
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
  const int64_t s = L.s;
  for (int64_t i = 0; i < s; ++i) {
    cpu::dropout_row(keep.data(), i + 1, L.dropout_first(bi, head, i, d), rng, d.p);  // keys > i are zero anyway
    for (int64_t j = 0; j <= i; ++j) Pd[i * s + j] = P[i * s + j] * keep[size_t(j)];
    for (int64_t j = i + 1; j < s; ++j) Pd[i * s + j] = 0;
  }
  return Pd;
}

}  // namespace

void attention_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs, const Tensor& qkv,
                   const Tensor& attention_start, const AttentionShape& shape,
                   const DropoutSpec& dropout) {
  const Layout L = check("attention_fwd", qkv, ctx, attention_start, shape);
  cpu::require_f32("attention_fwd", "lse", lse);
  MG_CHECK(lse.numel() == L.b * L.n * L.s, "attention_fwd: lse must be [b, n, s]");
  if (probs.defined()) {
    cpu::require_f32("attention_fwd", "probs", probs);
    MG_CHECK(probs.numel() == L.b * L.n * L.s * L.s, "attention_fwd: probs must be [b, n, s, s]");
  }
  const int64_t s = L.s;
  const float* x = qkv.data<float>();
  float* out = ctx.data<float>();
  float* lp = lse.data<float>();
  float* pp = probs.defined() ? probs.data<float>() : nullptr;
  const int32_t* st = attention_start.defined() ? attention_start.data<int32_t>() : nullptr;
  const Philox rng(dropout.seed, dropout.stream);
  cpu::blas_single_threaded();
#pragma omp parallel
  {
    std::vector<float> work(size_t(s * s) * (pp ? 1 : 2)), keep(static_cast<size_t>(s));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.n; ++task) {
      const int64_t bi = task / L.n;
      const int head = int(task % L.n);
      const float* base = x + bi * s * L.width;
      float* P = pp ? pp + task * s * s : work.data();
      float* Pd = pp ? work.data() : work.data() + s * s;
      sgemm(false, true, s, s, L.d, shape.softmax_scale, base + L.q(head), L.width,
            base + L.k(head / L.hpg), L.width, 0.0f, P, s);
      softmax_rows(P, lp + task * s, st, bi, s);
      const float* A = apply_dropout(Pd, P, L, bi, head, dropout, rng, keep);
      sgemm(false, false, s, L.d, s, 1.0f, A, s, base + L.v(head / L.hpg), L.width, 0.0f,
            out + bi * s * L.ctx_width + int64_t(head) * L.d, L.ctx_width);
    }
  }
}

void attention_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& lse,
                   const Tensor& probs, const Tensor& attention_start,
                   const AttentionShape& shape, const DropoutSpec& dropout) {
  const Layout L = check("attention_bwd", qkv, dctx, attention_start, shape);
  cpu::require_f32("attention_bwd", "dqkv", dqkv);
  cpu::require_numel("attention_bwd", dqkv, qkv);
  const int64_t s = L.s;
  const float* x = qkv.data<float>();
  const float* dout = dctx.data<float>();
  float* dx = dqkv.data<float>();
  const float* lp = lse.data<float>();
  const float* pp = probs.defined() ? probs.data<float>() : nullptr;
  const int32_t* st = attention_start.defined() ? attention_start.data<int32_t>() : nullptr;
  const Philox rng(dropout.seed, dropout.stream);
  const float sc = shape.softmax_scale;
  cpu::blas_single_threaded();
  // One task per (batch, query group): heads of a group share dK, dV, so they run in order.
#pragma omp parallel
  {
    std::vector<float> work(size_t(s * s) * 3), keep(static_cast<size_t>(s));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.g; ++task) {
      const int64_t bi = task / L.g;
      const int group = int(task % L.g);
      const float* base = x + bi * s * L.width;
      float* dbase = dx + bi * s * L.width;
      const float* dO_b = dout + bi * s * L.ctx_width;
      for (int hh = 0; hh < L.hpg; ++hh) {
        const int head = group * L.hpg + hh;
        const int64_t hidx = bi * L.n + head;
        float* P = work.data();
        float* Pd = work.data() + s * s;
        float* dP = work.data() + 2 * s * s;
        if (pp) {
          std::copy(pp + hidx * s * s, pp + (hidx + 1) * s * s, P);
        } else {
          sgemm(false, true, s, s, L.d, sc, base + L.q(head), L.width, base + L.k(group), L.width,
                0.0f, P, s);
          softmax_from_lse(P, lp + hidx * s, st, bi, s);
        }
        const float* A = apply_dropout(Pd, P, L, bi, head, dropout, rng, keep);
        const float* dO = dO_b + int64_t(head) * L.d;
        const float beta = hh == 0 ? 0.0f : 1.0f;
        // dV += Pd^T dO
        sgemm(true, false, s, L.d, s, 1.0f, A, s, dO, L.ctx_width, beta, dbase + L.v(group),
              L.width);
        // dPd = dO V^T
        sgemm(false, true, s, s, L.d, 1.0f, dO, L.ctx_width, base + L.v(group), L.width, 0.0f, dP,
              s);
        for (int64_t i = 0; i < s; ++i) {
          float* dpr = dP + i * s;
          const float* pr = P + i * s;
          if (dropout.active()) {
            cpu::dropout_row(keep.data(), i + 1, L.dropout_first(bi, head, i, dropout), rng,
                             dropout.p);
            for (int64_t j = 0; j <= i; ++j) dpr[j] *= keep[size_t(j)];
          }
          float D = 0;
          for (int64_t j = 0; j <= i; ++j) D += pr[j] * dpr[j];
          for (int64_t j = 0; j <= i; ++j) dpr[j] = pr[j] * (dpr[j] - D);
          for (int64_t j = i + 1; j < s; ++j) dpr[j] = 0;
        }
        // dQ = sc * dS K ; dK += sc * dS^T Q
        sgemm(false, false, s, L.d, s, sc, dP, s, base + L.k(group), L.width, 0.0f,
              dbase + L.q(head), L.width);
        sgemm(true, false, s, L.d, s, sc, dP, s, base + L.q(head), L.width, beta,
              dbase + L.k(group), L.width);
      }
    }
  }
}

}  // namespace megatron::ops
