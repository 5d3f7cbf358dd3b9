// Self-attention fused per (batch, head) on the CPU: S = scale * Q K^T (sgemm on strided views of
// the fused QKV activation), the mask (causal or bidirectional, per-query starts, sliding
// windows, key padding) and ALiBi bias, softmax (row log-sum-exp saved), Philox dropout,
// ctx = P V (sgemm). Only the softmax probabilities [s, s] per head are kept for backward, and
// only when the caller asks (probs defined); otherwise backward recomputes S from Q, K and the
// saved log-sum-exp (selective recompute). OpenMP over (batch, head) tasks; OpenBLAS
// single-threaded. Query rows run in tiles of 64 against the key range the tile can see (for
// causal attention keys [0, the tile's last position]; with windows or bidirectional attention
// [the tile's first visible key, its last]), in per-thread tile buffers.
// The query-subset ops (context parallelism, causal only) run the same code for sq query rows at
// given positions of the sequence against all kv_seq keys. The ring's block ops are in
// cpu_attention_block.cpp.
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
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// sq query rows against skv key positions. Without query positions (plain self-attention) query
// row i is position i and sq == skv; with them (context parallelism) row i is position qpos[i].
struct Layout {
  int64_t b = 0, sq = 0, skv = 0, width = 0, ctx_width = 0;
  int n = 0, g = 0, hpg = 0, d = 0;
  int head_offset = 0, total_heads = 0;  // dropout indexes heads globally (tensor parallelism)
  const int32_t* qpos = nullptr;
  const int32_t* start = nullptr;  // [b, sq] or null
  const int32_t* pad = nullptr;    // key padding [b, skv] or null
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
  std::vector<float> slopes;  // ALiBi slope of each local head, or empty
  int64_t pos(int64_t i) const { return qpos ? qpos[i] : i; }
  // Tiles span [first visible key, last) instead of [0, last) (windows, bidirectional).
  bool ranged() const { return !causal || window_left >= 0; }
  // Keys [lo, hi) that query row i of batch bi may see, before key padding.
  void key_range(int64_t bi, int64_t i, int64_t& lo, int64_t& hi) const {
    const int64_t p = pos(i);
    lo = start ? start[bi * sq + i] : 0;
    if (window_left >= 0) lo = std::max(lo, p - window_left);
    hi = causal ? p + 1 : (window_right >= 0 ? std::min(skv, p + window_right + 1) : skv);
    if (hi < lo) hi = lo;
  }
  const int32_t* pad_row(int64_t bi) const { return pad ? pad + bi * skv : nullptr; }
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
             const Tensor& query_positions, const Tensor& key_padding, const AttentionShape& sh) {
  cpu::require_f32(op, "qkv", qkv);
  cpu::require_f32(op, "ctx", ctx);
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0, op, ": heads ", sh.heads,
           " not a multiple of groups ", sh.groups);
  const int total = sh.total_heads > 0 ? sh.total_heads : sh.heads;
  MG_CHECK(sh.head_offset >= 0 && sh.head_offset + sh.heads <= total, op, ": heads [",
           sh.head_offset, ", ", sh.head_offset + sh.heads, ") outside the layer's ", total);
  cpu::check_mask_fields(op, sh);
  if (query_positions.defined()) cpu::require_causal_only(op, sh);
  Layout L;
  L.b = sh.batch;
  L.sq = sh.seq;
  L.skv = query_positions.defined() ? sh.kv_seq : sh.seq;
  L.n = sh.heads;
  L.g = sh.groups;
  L.hpg = sh.heads / sh.groups;
  L.d = sh.head_dim;
  L.head_offset = sh.head_offset;
  L.total_heads = total;
  L.width = int64_t(L.g) * (L.hpg + 2) * L.d;
  L.ctx_width = int64_t(L.n) * L.d;
  L.causal = sh.causal;
  L.window_left = sh.window_left;
  L.window_right = sh.causal ? -1 : sh.window_right;
  L.slopes = cpu::local_alibi_slopes(sh);
  if (query_positions.defined()) {
    cpu::require_host(op, query_positions);
    MG_CHECK(query_positions.dtype() == DType::I32 && query_positions.numel() == L.sq &&
                 query_positions.is_contiguous(),
             op, ": query_positions must be contiguous int32 [seq]");
    MG_CHECK(L.skv >= L.sq, op, ": kv_seq ", L.skv, " < seq ", L.sq);
    L.qpos = query_positions.data<int32_t>();
    for (int64_t i = 0; i < L.sq; ++i)
      MG_CHECK(L.qpos[i] >= 0 && L.qpos[i] < L.skv, op, ": query position ", L.qpos[i],
               " outside [0, ", L.skv, ")");
  } else {
    MG_CHECK(sh.kv_seq == 0 || sh.kv_seq == sh.seq, op, ": kv_seq needs query_positions");
  }
  MG_CHECK(qkv.numel() == L.b * L.skv * L.width, op, ": qkv ", shape_str(qkv.shape()),
           " does not match b=", L.b, " s=", L.skv, " width=", L.width);
  MG_CHECK(ctx.numel() == L.b * L.sq * L.ctx_width, op, ": ctx size mismatch");
  if (start.defined()) {
    cpu::require_host(op, start);
    MG_CHECK(start.dtype() == DType::I32 && start.numel() == L.b * L.sq && start.is_contiguous(),
             op, ": attention_start must be contiguous int32 [b, s]");
    L.start = start.data<int32_t>();
    for (int64_t i = 0; i < L.b * L.sq; ++i)
      MG_CHECK(L.start[i] >= 0 && L.start[i] <= L.pos(i % L.sq), op, ": attention_start[", i,
               "] = ", L.start[i], " must lie in [0, position]");
  }
  if (key_padding.defined()) {
    cpu::require_host(op, key_padding);
    MG_CHECK(key_padding.dtype() == DType::I32 && key_padding.numel() == L.b * L.skv &&
                 key_padding.is_contiguous(),
             op, ": key_padding must be contiguous int32 [b, s], got ",
             shape_str(key_padding.shape()));
    L.pad = key_padding.data<int32_t>();
  }
  return L;
}

// One query row of a score tile: the entry of key j (c0 <= j < c1) is row[j - c0]. ALiBi adds
// slope * (j - p) over the visible range [lo, hi).
inline void add_alibi(float* row, int64_t c0, int64_t lo, int64_t hi, int64_t p, float slope) {
  for (int64_t j = lo; j < hi; ++j) row[j - c0] += slope * float(j - p);
}

// Scaled scores -> probabilities over the visible keys [lo, hi) minus padded ones (pad row or
// null), zeros over the rest of [c0, c1). Returns the row's log-sum-exp (-inf if it sees no key).
float softmax_row(float* row, int64_t c0, int64_t c1, int64_t lo, int64_t hi, const int32_t* pad) {
  float mx = kNegInf;
  bool any = hi > lo;
  if (pad) {
    any = false;
    for (int64_t j = lo; j < hi; ++j)
      if (pad[j]) {
        mx = std::max(mx, row[j - c0]);
        any = true;
      }
  } else {
    for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, row[j - c0]);
  }
  if (!any) {
    std::fill(row, row + (c1 - c0), 0.0f);
    return kNegInf;
  }
  float sum = 0;
  if (pad) {
    for (int64_t j = lo; j < hi; ++j) {
      const float e = pad[j] ? cpu::fast_exp(row[j - c0] - mx) : 0.0f;
      row[j - c0] = e;
      sum += e;
    }
  } else {
    for (int64_t j = lo; j < hi; ++j) {
      row[j - c0] = cpu::fast_exp(row[j - c0] - mx);
      sum += row[j - c0];
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t j = c0; j < lo; ++j) row[j - c0] = 0;
  for (int64_t j = lo; j < hi; ++j) row[j - c0] *= inv;
  for (int64_t j = hi; j < c1; ++j) row[j - c0] = 0;
  return mx + std::log(sum);
}

// Probabilities from the scaled scores and the saved lse (backward recompute), as softmax_row.
void softmax_row_from_lse(float* row, int64_t c0, int64_t c1, int64_t lo, int64_t hi,
                          const int32_t* pad, float lse) {
  if (lse == kNegInf) {
    std::fill(row, row + (c1 - c0), 0.0f);
    return;
  }
  for (int64_t j = c0; j < lo; ++j) row[j - c0] = 0;
  if (pad) {
    for (int64_t j = lo; j < hi; ++j) row[j - c0] = pad[j] ? cpu::fast_exp(row[j - c0] - lse) : 0.0f;
  } else {
    for (int64_t j = lo; j < hi; ++j) row[j - c0] = cpu::fast_exp(row[j - c0] - lse);
  }
  for (int64_t j = hi; j < c1; ++j) row[j - c0] = 0;
}

// Pd = P * keep for rows [i0, i1) of head (bi, head) over tile keys [k0, k1) (P row i at
// P + (i - i0) * ldp, key k0 first; Pd compact, width k1 - k0); returns Pd, or P when dropout is
// off. The mask row of each query is drawn from its first tile key.
const float* apply_dropout(float* Pd, const float* P, int64_t ldp, int64_t k0, int64_t k1,
                           int64_t i0, int64_t i1, const Layout& L, int64_t bi, int head,
                           const DropoutSpec& d, const Philox& rng, std::vector<float>& keep) {
  if (!d.active()) return P;
  const int64_t w = k1 - k0;
  for (int64_t i = i0; i < i1; ++i) {
    int64_t lo = 0, hi = 0;
    L.key_range(bi, i, lo, hi);
    const int64_t he = std::clamp(hi, k0, k1);  // keys >= hi have P = 0
    const float* pr = P + (i - i0) * ldp;
    float* out = Pd + (i - i0) * w;
    cpu::dropout_row(keep.data(), he - k0, L.dropout_first(bi, head, L.pos(i), d) + uint64_t(k0),
                     rng, d.p);
    for (int64_t j = 0; j < he - k0; ++j) out[j] = pr[j] * keep[size_t(j)];
    for (int64_t j = he - k0; j < w; ++j) out[j] = 0;
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

// Query rows run in tiles of kTileRows, each against the keys [k0, k1) its rows can see: for
// causal attention k0 = 0 and k1 past the tile's last position (about half of the square); with
// windows or bidirectional attention k0 is the tile's first visible key. Per-thread buffers of
// kTileRows x kv_seq (small enough for the caches, never an s x s matrix unless probabilities
// are saved). A tile whose rows see no key gets k0 = k1.
constexpr int64_t kTileRows = 64;
template <class F>
void for_row_tiles(const Layout& L, int64_t bi, F&& f) {
  for (int64_t i0 = 0; i0 < L.sq; i0 += kTileRows) {
    const int64_t i1 = std::min(L.sq, i0 + kTileRows);
    int64_t k0 = L.ranged() ? L.skv : 0, k1 = 0;
    for (int64_t i = i0; i < i1; ++i) {
      int64_t lo = 0, hi = 0;
      L.key_range(bi, i, lo, hi);
      if (hi <= lo) continue;
      if (L.ranged()) k0 = std::min(k0, lo);
      k1 = std::max(k1, hi);
    }
    if (k1 <= k0) k0 = k1 = 0;
    f(i0, i1 - i0, k0, k1);
  }
}

void forward(const Layout& L, const Tensor& ctx, const Tensor& lse, const Tensor& probs,
             const Tensor& qkv, float scale, const DropoutSpec& dropout) {
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
  const Philox rng(dropout.seed, dropout.stream);
  cpu::blas_single_threaded();
#pragma omp parallel
  {
    std::vector<float> work(size_t(kTileRows * skv) * 2), keep(static_cast<size_t>(skv));
    std::vector<float> qbuf(L.qpos ? size_t(sq * L.d) : 0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.n; ++task) {
      const int64_t bi = task / L.n;
      const int head = int(task % L.n);
      const int32_t* pad = L.pad_row(bi);
      const float* base = x + bi * skv * L.width;
      int64_t ldq = 0;
      const float* Q = query_rows(L, base, head, qbuf.data(), ldq);
      float* O = out + bi * sq * L.ctx_width + int64_t(head) * L.d;
      float* lrow = lp + task * sq;
      for_row_tiles(L, bi, [&](int64_t i0, int64_t nt, int64_t k0, int64_t k1) {
        // Saved probabilities are whole rows of [sq, skv]; otherwise a compact nt x (k1-k0) tile.
        float* P = pp ? pp + (task * sq + i0) * skv : work.data();
        const int64_t ldp = pp ? skv : k1 - k0, c0 = pp ? 0 : k0, c1 = pp ? skv : k1;
        if (k1 == k0) {  // no row of the tile sees a key
          for (int64_t i = i0; i < i0 + nt; ++i) {
            lrow[i] = kNegInf;
            std::fill_n(O + i * L.ctx_width, L.d, 0.0f);
            if (pp) std::fill_n(P + (i - i0) * skv, skv, 0.0f);
          }
          return;
        }
        float* S = P + (k0 - c0);  // the tile's first key
        sgemm(false, true, nt, k1 - k0, L.d, scale, Q + i0 * ldq, ldq,
              base + k0 * L.width + L.k(head / L.hpg), L.width, 0.0f, S, ldp);
        for (int64_t i = i0; i < i0 + nt; ++i) {
          int64_t lo = 0, hi = 0;
          L.key_range(bi, i, lo, hi);
          float* row = P + (i - i0) * ldp;
          if (!L.slopes.empty()) add_alibi(row, c0, lo, hi, L.pos(i), L.slopes[size_t(head)]);
          lrow[i] = softmax_row(row, c0, c1, lo, hi, pad);
        }
        float* Pd = work.data() + kTileRows * skv;
        const float* A = apply_dropout(Pd, S, ldp, k0, k1, i0, i0 + nt, L, bi, head, dropout,
                                       rng, keep);
        const int64_t lda = A == S ? ldp : k1 - k0;
        sgemm(false, false, nt, L.d, k1 - k0, 1.0f, A, lda, base + k0 * L.width + L.v(head / L.hpg),
              L.width, 0.0f, O + i0 * L.ctx_width, L.ctx_width);
      });
    }
  }
}

void backward(const Layout& L, const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
              const Tensor& lse, const Tensor& probs, float sc, const DropoutSpec& dropout) {
  cpu::require_f32("attention_bwd", "dqkv", dqkv);
  cpu::require_f32("attention_bwd", "lse", lse);
  cpu::require_numel("attention_bwd", dqkv, qkv);
  MG_CHECK(lse.numel() == L.b * L.n * L.sq, "attention_bwd: lse must be [b, n, s]");
  const int64_t sq = L.sq, skv = L.skv;
  if (probs.defined()) {
    cpu::require_f32("attention_bwd", "probs", probs);
    MG_CHECK(probs.numel() == L.b * L.n * sq * skv, "attention_bwd: probs must be [b, n, s, kv_s]");
  }
  const float* x = qkv.data<float>();
  const float* dout = dctx.data<float>();
  float* dx = dqkv.data<float>();
  const float* lp = lse.data<float>();
  const float* pp = probs.defined() ? probs.data<float>() : nullptr;
  const Philox rng(dropout.seed, dropout.stream);
  // A query subset writes dQ only at its rows: the query columns of the other rows are zero.
  if (L.qpos) std::fill(dx, dx + dqkv.numel(), 0.0f);
  cpu::blas_single_threaded();
  // One task per (batch, query group): heads of a group share dK, dV, so they run in order.
#pragma omp parallel
  {
    std::vector<float> work(size_t(kTileRows * skv) * 3), keep(static_cast<size_t>(skv));
    std::vector<float> qbuf(L.qpos ? size_t(sq * L.d) : 0), dqbuf(qbuf.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < L.b * L.g; ++task) {
      const int64_t bi = task / L.g;
      const int group = int(task % L.g);
      const int32_t* pad = L.pad_row(bi);
      const float* base = x + bi * skv * L.width;
      float* dbase = dx + bi * skv * L.width;
      const float* dO_b = dout + bi * sq * L.ctx_width;
      // The group's dK, dV (adjacent columns) accumulate over its heads and tiles.
      for (int64_t j = 0; j < skv; ++j) std::fill_n(dbase + j * L.width + L.k(group), 2 * L.d, 0.0f);
      for (int hh = 0; hh < L.hpg; ++hh) {
        const int head = group * L.hpg + hh;
        const int64_t hidx = bi * L.n + head;
        int64_t ldq = 0;
        const float* Q = query_rows(L, base, head, qbuf.data(), ldq);
        const float* dO = dO_b + int64_t(head) * L.d;
        float* dQ = L.qpos ? dqbuf.data() : dbase + L.q(head);
        const int64_t ldd = L.qpos ? L.d : L.width;
        const float* K = base + L.k(group);
        const float* V = base + L.v(group);
        for_row_tiles(L, bi, [&](int64_t i0, int64_t nt, int64_t k0, int64_t k1) {
          const int64_t kw = k1 - k0;
          if (kw == 0) {  // rows that see no key: no gradient
            for (int64_t i = i0; i < i0 + nt; ++i) std::fill_n(dQ + i * ldd, L.d, 0.0f);
            return;
          }
          float* P = work.data();
          float* Pd = work.data() + kTileRows * skv;
          float* dP = work.data() + 2 * kTileRows * skv;
          const float* Pr = P;
          int64_t ldp = kw;
          if (pp) {  // the saved probabilities, rows of [sq, skv] from key k0
            Pr = pp + (hidx * sq + i0) * skv + k0;
            ldp = skv;
          } else {
            sgemm(false, true, nt, kw, L.d, sc, Q + i0 * ldq, ldq, K + k0 * L.width, L.width,
                  0.0f, P, kw);
            for (int64_t i = i0; i < i0 + nt; ++i) {
              int64_t lo = 0, hi = 0;
              L.key_range(bi, i, lo, hi);
              float* row = P + (i - i0) * kw;
              if (!L.slopes.empty()) add_alibi(row, k0, lo, hi, L.pos(i), L.slopes[size_t(head)]);
              softmax_row_from_lse(row, k0, k1, lo, hi, pad, lp[hidx * sq + i]);
            }
          }
          const float* A = apply_dropout(Pd, Pr, ldp, k0, k1, i0, i0 + nt, L, bi, head, dropout,
                                         rng, keep);
          const int64_t lda = A == Pr ? ldp : kw;
          const float* dOt = dO + i0 * L.ctx_width;
          // dV += Pd^T dO; dPd = dO V^T
          sgemm(true, false, kw, L.d, nt, 1.0f, A, lda, dOt, L.ctx_width, 1.0f,
                dbase + k0 * L.width + L.v(group), L.width);
          sgemm(false, true, nt, kw, L.d, 1.0f, dOt, L.ctx_width, V + k0 * L.width, L.width,
                0.0f, dP, kw);
          for (int64_t i = i0; i < i0 + nt; ++i) {
            int64_t lo = 0, hi = 0;
            L.key_range(bi, i, lo, hi);
            const int64_t he = std::clamp(hi, k0, k1) - k0;  // keys >= hi have P = 0
            float* dpr = dP + (i - i0) * kw;
            const float* pr = Pr + (i - i0) * ldp;
            if (dropout.active()) {
              cpu::dropout_row(keep.data(), he,
                               L.dropout_first(bi, head, L.pos(i), dropout) + uint64_t(k0), rng,
                               dropout.p);
              for (int64_t j = 0; j < he; ++j) dpr[j] *= keep[size_t(j)];
            }
            float D = 0;
            for (int64_t j = 0; j < he; ++j) D += pr[j] * dpr[j];
            for (int64_t j = 0; j < he; ++j) dpr[j] = pr[j] * (dpr[j] - D);
            for (int64_t j = he; j < kw; ++j) dpr[j] = 0;
          }
          // dQ = sc * dS K ; dK += sc * dS^T Q
          sgemm(false, false, nt, L.d, kw, sc, dP, kw, K + k0 * L.width, L.width, 0.0f,
                dQ + i0 * ldd, ldd);
          sgemm(true, false, kw, L.d, nt, sc, dP, kw, Q + i0 * ldq, ldq, 1.0f,
                dbase + k0 * L.width + L.k(group), L.width);
        });
        if (L.qpos)
          for (int64_t i = 0; i < sq; ++i)
            std::copy(dqbuf.data() + i * L.d, dqbuf.data() + (i + 1) * L.d,
                      dbase + L.qpos[i] * L.width + L.q(head));
      }
    }
  }
}

}  // namespace

void attention_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs, const Tensor& qkv,
                   const Tensor& attention_start, const AttentionShape& shape,
                   const DropoutSpec& dropout, const Tensor& key_padding) {
  const Layout L = check("attention_fwd", qkv, ctx, attention_start, Tensor(), key_padding, shape);
  forward(L, ctx, lse, probs, qkv, shape.softmax_scale, dropout);
}

void attention_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& lse,
                   const Tensor& probs, const Tensor& attention_start,
                   const AttentionShape& shape, const DropoutSpec& dropout,
                   const Tensor& key_padding) {
  const Layout L = check("attention_bwd", qkv, dctx, attention_start, Tensor(), key_padding, shape);
  backward(L, dqkv, dctx, qkv, lse, probs, shape.softmax_scale, dropout);
}

void attention_subset_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs,
                          const Tensor& qkv, const Tensor& query_positions,
                          const Tensor& attention_start, const AttentionShape& shape,
                          const DropoutSpec& dropout) {
  MG_CHECK(query_positions.defined(), "attention_subset_fwd: query_positions is undefined");
  const Layout L =
      check("attention_subset_fwd", qkv, ctx, attention_start, query_positions, Tensor(), shape);
  forward(L, ctx, lse, probs, qkv, shape.softmax_scale, dropout);
}

void attention_subset_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                          const Tensor& query_positions, const Tensor& lse, const Tensor& probs,
                          const Tensor& attention_start, const AttentionShape& shape,
                          const DropoutSpec& dropout) {
  MG_CHECK(query_positions.defined(), "attention_subset_bwd: query_positions is undefined");
  const Layout L =
      check("attention_subset_bwd", qkv, dctx, attention_start, query_positions, Tensor(), shape);
  backward(L, dqkv, dctx, qkv, lse, probs, shape.softmax_scale, dropout);
}

}  // namespace megatron::ops::cpu
