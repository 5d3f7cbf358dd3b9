// Blockwise attention for context parallelism's ring exchange (--cp-comm-type p2p) on the CPU:
// this rank's query rows against one packed key/value block at given sequence positions. Only
// the part of the block the causal mask lets through is computed; partial softmaxes (lse) are
// merged with attention_merge, and backward takes the final lse and delta (attention_delta).
// Causal masks only (with per-query starts): other masks are rejected.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_attention_common.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {

namespace {

struct BlockLayout {
  int64_t b, sq, skv, S, qkv_width, kv_width, ctx_width;
  int n, g, hpg, d;
  int head_offset, total_heads;
  const int32_t* qpos;
  const int32_t* kpos;
  const int32_t* start;  // [b, sq] or null
  // Query rows [qa, sq) and keys [0, kb) can meet; the rest of the block is masked.
  int64_t qa = 0, kb = 0;
  int64_t q(int head) const { return int64_t(head / hpg) * (hpg + 2) * d + int64_t(head % hpg) * d; }
  int64_t k(int group) const { return int64_t(group) * 2 * d; }
  int64_t v(int group) const { return k(group) + d; }
  // Keys j of query row i (batch bi) lie in [lo, hi): start <= kpos[j] <= qpos[i].
  void key_range(int64_t bi, int64_t i, int64_t& lo, int64_t& hi) const {
    const int32_t s0 = start ? start[bi * sq + i] : 0;
    lo = std::lower_bound(kpos, kpos + kb, s0) - kpos;
    hi = std::upper_bound(kpos, kpos + kb, qpos[i]) - kpos;
    if (hi < lo) hi = lo;
  }
  uint64_t dropout_first(int64_t bi, int head, int64_t p, const DropoutSpec& dr) const {
    return dr.element_offset + uint64_t(((bi * total_heads + head_offset + head) * S + p) * S);
  }
  // keep[j - lo] for keys [lo, hi) of the query at position p: the whole attention's mask,
  // drawn run by run of consecutive key positions.
  void keep_row(float* keep, int64_t bi, int head, int64_t p, int64_t lo, int64_t hi,
                const DropoutSpec& dr, const Philox& rng) const {
    const uint64_t first = dropout_first(bi, head, p, dr);
    for (int64_t j = lo; j < hi;) {
      int64_t e = j + 1;
      while (e < hi && kpos[e] == kpos[e - 1] + 1) ++e;
      cpu::dropout_row(keep + (j - lo), e - j, first + uint64_t(kpos[j]), rng, dr.p);
      j = e;
    }
  }
};

void check_positions(const char* op, const char* name, const Tensor& pos, int64_t n, int64_t S) {
  cpu::require_host(op, pos);
  MG_CHECK(pos.defined() && pos.dtype() == DType::I32 && pos.numel() == n && pos.is_contiguous(),
           op, ": ", name, " must be contiguous int32 [", n, "]");
  const int32_t* p = pos.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MG_CHECK(p[i] >= 0 && p[i] < S, op, ": ", name, "[", i, "] = ", p[i], " outside [0, ", S, ")");
    MG_CHECK(i == 0 || p[i] > p[i - 1], op, ": ", name, " must be ascending");
  }
}

BlockLayout check_block(const char* op, const Tensor& q_qkv, const Tensor& qpos, const Tensor& kv,
                        const Tensor& kpos, const Tensor& start, const AttentionShape& sh) {
  cpu::require_f32(op, "q_qkv", q_qkv);
  cpu::require_f32(op, "kv", kv);
  cpu::require_causal_only(op, sh);
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0, op, ": heads ", sh.heads,
           " not a multiple of groups ", sh.groups);
  const int total = sh.total_heads > 0 ? sh.total_heads : sh.heads;
  MG_CHECK(sh.head_offset >= 0 && sh.head_offset + sh.heads <= total, op, ": heads outside the layer");
  MG_CHECK(sh.seq > 0 && sh.kv_seq > 0 && sh.full_seq >= sh.seq && sh.full_seq >= sh.kv_seq, op,
           ": needs seq, kv_seq > 0 and full_seq >= both");
  BlockLayout L{};
  L.b = sh.batch;
  L.sq = sh.seq;
  L.skv = sh.kv_seq;
  L.S = sh.full_seq;
  L.n = sh.heads;
  L.g = sh.groups;
  L.hpg = sh.heads / sh.groups;
  L.d = sh.head_dim;
  L.head_offset = sh.head_offset;
  L.total_heads = total;
  L.qkv_width = int64_t(L.g) * (L.hpg + 2) * L.d;
  L.kv_width = int64_t(L.g) * 2 * L.d;
  L.ctx_width = int64_t(L.n) * L.d;
  MG_CHECK(q_qkv.numel() == L.b * L.sq * L.qkv_width, op, ": q_qkv ", shape_str(q_qkv.shape()),
           " does not match b=", L.b, " seq=", L.sq, " width=", L.qkv_width);
  MG_CHECK(kv.numel() == L.b * L.skv * L.kv_width, op, ": kv ", shape_str(kv.shape()),
           " does not match b=", L.b, " kv_seq=", L.skv, " width=", L.kv_width);
  check_positions(op, "q_positions", qpos, L.sq, L.S);
  check_positions(op, "kv_positions", kpos, L.skv, L.S);
  L.qpos = qpos.data<int32_t>();
  L.kpos = kpos.data<int32_t>();
  L.start = nullptr;
  if (start.defined()) {
    cpu::require_host(op, start);
    MG_CHECK(start.dtype() == DType::I32 && start.numel() == L.b * L.sq && start.is_contiguous(),
             op, ": attention_start must be int32 [b, seq]");
    L.start = start.data<int32_t>();
    for (int64_t i = 0; i < L.b * L.sq; ++i)
      MG_CHECK(L.start[i] >= 0 && L.start[i] <= L.qpos[i % L.sq], op, ": attention_start[", i,
               "] = ", L.start[i], " must lie in [0, position]");
  }
  L.qa = std::lower_bound(L.qpos, L.qpos + L.sq, L.kpos[0]) - L.qpos;
  L.kb = std::upper_bound(L.kpos, L.kpos + L.skv, L.qpos[L.sq - 1]) - L.kpos;
  return L;
}

// P over the block's active keys from the scaled scores, given each row's lse (or, when
// lse_out, computing it): rows [qa, sq), keys [0, kb), ld kb; masked entries zero.
void block_softmax(float* P, const float* lse_in, float* lse_out, const BlockLayout& L,
                   int64_t bi) {
  const int64_t kb = L.kb;
  for (int64_t i = L.qa; i < L.sq; ++i) {
    float* row = P + (i - L.qa) * kb;
    int64_t lo = 0, hi = 0;
    L.key_range(bi, i, lo, hi);
    float m = 0;
    if (lse_out) {
      if (lo == hi) {
        lse_out[i] = -std::numeric_limits<float>::infinity();
        std::fill(row, row + kb, 0.0f);
        continue;
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, row[j]);
      float sum = 0;
      for (int64_t j = lo; j < hi; ++j) sum += cpu::fast_exp(row[j] - mx);
      lse_out[i] = mx + std::log(sum);
      m = lse_out[i];
    } else {
      m = lse_in[i];
      if (!std::isfinite(m)) lo = hi = 0;
    }
    for (int64_t j = 0; j < lo; ++j) row[j] = 0;
    for (int64_t j = lo; j < hi; ++j) row[j] = cpu::fast_exp(row[j] - m);
    for (int64_t j = hi; j < kb; ++j) row[j] = 0;
  }
}

}  // namespace

void attention_block_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& q_qkv,
                         const Tensor& q_positions, const Tensor& kv, const Tensor& kv_positions,
                         const Tensor& attention_start, const AttentionShape& shape,
                         const DropoutSpec& dropout) {
  const char* op = "attention_block_fwd";
  const BlockLayout L = check_block(op, q_qkv, q_positions, kv, kv_positions, attention_start, shape);
  cpu::require_f32(op, "ctx", ctx);
  cpu::require_f32(op, "lse", lse);
  MG_CHECK(ctx.numel() == L.b * L.sq * L.ctx_width, op, ": ctx must be [b, seq, n*d]");
  MG_CHECK(lse.numel() == L.b * L.n * L.sq, op, ": lse must be [b, n, seq]");
  float* out = ctx.data<float>();
  float* lp = lse.data<float>();
  const float* xq = q_qkv.data<float>();
  const float* xkv = kv.data<float>();
  const float scale = shape.softmax_scale;
  const Philox rng(dropout.seed, dropout.stream);
  const int64_t nq = L.sq - L.qa, kb = L.kb;
  cpu::blas_single_threaded();
#pragma omp parallel
  {
    std::vector<float> work(size_t(std::max<int64_t>(nq * kb, 1))), keep(size_t(std::max<int64_t>(kb, 1)));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.n; ++task) {
      const int64_t bi = task / L.n;
      const int head = int(task % L.n);
      float* lrow = lp + task * L.sq;
      float* o = out + bi * L.sq * L.ctx_width + int64_t(head) * L.d;
      for (int64_t i = 0; i < L.qa; ++i) {
        lrow[i] = -std::numeric_limits<float>::infinity();
        std::fill(o + i * L.ctx_width, o + i * L.ctx_width + L.d, 0.0f);
      }
      if (nq == 0) continue;
      if (kb == 0) {
        for (int64_t i = L.qa; i < L.sq; ++i) {
          lrow[i] = -std::numeric_limits<float>::infinity();
          std::fill(o + i * L.ctx_width, o + i * L.ctx_width + L.d, 0.0f);
        }
        continue;
      }
      const float* Q = xq + (bi * L.sq + L.qa) * L.qkv_width + L.q(head);
      const float* K = xkv + bi * L.skv * L.kv_width + L.k(head / L.hpg);
      const float* V = xkv + bi * L.skv * L.kv_width + L.v(head / L.hpg);
      float* P = work.data();
      sgemm(false, true, nq, kb, L.d, scale, Q, L.qkv_width, K, L.kv_width, 0.0f, P, kb);
      block_softmax(P, nullptr, lrow, L, bi);
      if (dropout.active()) {
        for (int64_t i = L.qa; i < L.sq; ++i) {
          int64_t lo = 0, hi = 0;
          L.key_range(bi, i, lo, hi);
          L.keep_row(keep.data(), bi, head, L.qpos[i], lo, hi, dropout, rng);
          float* row = P + (i - L.qa) * kb;
          for (int64_t j = lo; j < hi; ++j) row[j] *= keep[size_t(j - lo)];
        }
      }
      sgemm(false, false, nq, L.d, kb, 1.0f, P, kb, V, L.kv_width, 0.0f, o + L.qa * L.ctx_width,
            L.ctx_width);
    }
  }
}

void attention_merge(const Tensor& ctx, const Tensor& lse, const Tensor& ctx_b, const Tensor& lse_b,
                     const AttentionShape& sh) {
  const char* op = "attention_merge";
  for (const Tensor* t : {&ctx, &lse, &ctx_b, &lse_b}) cpu::require_f32(op, "operand", *t);
  const int64_t b = sh.batch, sq = sh.seq, n = sh.heads, d = sh.head_dim, w = n * d;
  MG_CHECK(ctx.numel() == b * sq * w && ctx_b.numel() == ctx.numel() &&
               lse.numel() == b * n * sq && lse_b.numel() == lse.numel(),
           op, ": ctx must be [b, seq, n*d] and lse [b, n, seq], both pairs alike");
  float* o = ctx.data<float>();
  float* l = lse.data<float>();
  const float* ob = ctx_b.data<float>();
  const float* lb = lse_b.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < b * n; ++task) {
    const int64_t bi = task / n, head = task % n;
    for (int64_t i = 0; i < sq; ++i) {
      const float a = l[task * sq + i], c = lb[task * sq + i];
      if (c == -std::numeric_limits<float>::infinity()) continue;  // the block adds nothing
      float wa = 0, wb = 1, m = c;
      if (a != -std::numeric_limits<float>::infinity()) {
        const float mx = std::max(a, c);
        m = mx + std::log(std::exp(a - mx) + std::exp(c - mx));
        wa = std::exp(a - m);
        wb = std::exp(c - m);
      }
      l[task * sq + i] = m;
      float* orow = o + (bi * sq + i) * w + head * d;
      const float* brow = ob + (bi * sq + i) * w + head * d;
      for (int64_t k = 0; k < d; ++k) orow[k] = wa * orow[k] + wb * brow[k];
    }
  }
}

void attention_delta(const Tensor& delta, const Tensor& dctx, const Tensor& ctx,
                     const AttentionShape& sh) {
  const char* op = "attention_delta";
  for (const Tensor* t : {&delta, &dctx, &ctx}) cpu::require_f32(op, "operand", *t);
  const int64_t b = sh.batch, sq = sh.seq, n = sh.heads, d = sh.head_dim, w = n * d;
  MG_CHECK(ctx.numel() == b * sq * w && dctx.numel() == ctx.numel() && delta.numel() == b * n * sq,
           op, ": ctx and dctx must be [b, seq, n*d], delta [b, n, seq]");
  float* D = delta.data<float>();
  const float* o = ctx.data<float>();
  const float* g = dctx.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < b * n; ++task) {
    const int64_t bi = task / n, head = task % n;
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t at = (bi * sq + i) * w + head * d;
      float s = 0;
      for (int64_t k = 0; k < d; ++k) s += o[at + k] * g[at + k];
      D[task * sq + i] = s;
    }
  }
}

void attention_block_bwd(const Tensor& dq, const Tensor& dkv, const Tensor& dctx,
                         const Tensor& q_qkv, const Tensor& q_positions, const Tensor& kv,
                         const Tensor& kv_positions, const Tensor& lse, const Tensor& delta,
                         const Tensor& attention_start, const AttentionShape& shape,
                         const DropoutSpec& dropout) {
  const char* op = "attention_block_bwd";
  const BlockLayout L = check_block(op, q_qkv, q_positions, kv, kv_positions, attention_start, shape);
  for (const Tensor* t : {&dq, &dkv, &dctx, &lse, &delta}) cpu::require_f32(op, "operand", *t);
  cpu::require_numel(op, dq, q_qkv);
  cpu::require_numel(op, dkv, kv);
  MG_CHECK(dctx.numel() == L.b * L.sq * L.ctx_width, op, ": dctx must be [b, seq, n*d]");
  MG_CHECK(lse.numel() == L.b * L.n * L.sq && delta.numel() == lse.numel(), op,
           ": lse and delta must be [b, n, seq]");
  const int64_t nq = L.sq - L.qa, kb = L.kb;
  if (nq == 0 || kb == 0) return;
  const float* xq = q_qkv.data<float>();
  const float* xkv = kv.data<float>();
  float* gq = dq.data<float>();
  float* gkv = dkv.data<float>();
  const float* dout = dctx.data<float>();
  const float* lp = lse.data<float>();
  const float* Dp = delta.data<float>();
  const float sc = shape.softmax_scale;
  const Philox rng(dropout.seed, dropout.stream);
  cpu::blas_single_threaded();
  // One task per (batch, query group): the group's heads share dK, dV, so they run in order.
#pragma omp parallel
  {
    std::vector<float> work(size_t(nq * kb) * 2), keep(static_cast<size_t>(kb));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.g; ++task) {
      const int64_t bi = task / L.g;
      const int group = int(task % L.g);
      const float* K = xkv + bi * L.skv * L.kv_width + L.k(group);
      const float* V = xkv + bi * L.skv * L.kv_width + L.v(group);
      float* dK = gkv + bi * L.skv * L.kv_width + L.k(group);
      float* dV = gkv + bi * L.skv * L.kv_width + L.v(group);
      for (int hh = 0; hh < L.hpg; ++hh) {
        const int head = group * L.hpg + hh;
        const int64_t hidx = bi * L.n + head;
        const float* Q = xq + (bi * L.sq + L.qa) * L.qkv_width + L.q(head);
        float* dQ = gq + (bi * L.sq + L.qa) * L.qkv_width + L.q(head);
        const float* dO = dout + (bi * L.sq + L.qa) * L.ctx_width + int64_t(head) * L.d;
        float* P = work.data();
        float* dP = work.data() + nq * kb;
        sgemm(false, true, nq, kb, L.d, sc, Q, L.qkv_width, K, L.kv_width, 0.0f, P, kb);
        block_softmax(P, lp + hidx * L.sq, nullptr, L, bi);
        // dPd = dO V^T
        sgemm(false, true, nq, kb, L.d, 1.0f, dO, L.ctx_width, V, L.kv_width, 0.0f, dP, kb);
        for (int64_t i = L.qa; i < L.sq; ++i) {
          float* pr = P + (i - L.qa) * kb;
          float* dpr = dP + (i - L.qa) * kb;
          int64_t lo = 0, hi = 0;
          L.key_range(bi, i, lo, hi);
          if (!std::isfinite(lp[hidx * L.sq + i])) lo = hi = 0;
          const float Di = Dp[hidx * L.sq + i];
          if (dropout.active()) L.keep_row(keep.data(), bi, head, L.qpos[i], lo, hi, dropout, rng);
          for (int64_t j = lo; j < hi; ++j) {
            const float kj = dropout.active() ? keep[size_t(j - lo)] : 1.0f;
            const float p = pr[j];
            // dS = P (keep * dPd - D); P becomes Pd (P * keep) for dV
            dpr[j] = p * (kj * dpr[j] - Di);
            pr[j] = p * kj;
          }
          for (int64_t j = 0; j < lo; ++j) dpr[j] = 0;
          for (int64_t j = hi; j < kb; ++j) dpr[j] = 0;
        }
        // dV += Pd^T dO; dQ += sc dS K; dK += sc dS^T Q
        sgemm(true, false, kb, L.d, nq, 1.0f, P, kb, dO, L.ctx_width, 1.0f, dV, L.kv_width);
        sgemm(false, false, nq, L.d, kb, sc, dP, kb, K, L.kv_width, 1.0f, dQ, L.qkv_width);
        sgemm(true, false, kb, L.d, nq, sc, dP, kb, Q, L.qkv_width, 1.0f, dK, L.kv_width);
      }
    }
  }
}

}  // namespace megatron::ops::cpu
