// The core attention op on the CPU, forward (the backward is in cpu_attention_bwd.cpp), flash
// style: query rows run in tiles of 64 against blocks of up to 512 keys of the range the tile can
// see, with an online softmax (running row maximum and sum, the partial output rescaled when the
// maximum grows), so no score matrix larger than a tile x block is formed. With saved
// probabilities the tile's whole key range is one block written straight into the probs tensor.
// Q K^T and P V are OpenBLAS sgemm calls on strided views of the operands (sgemv for a lone query
// row, as in decoding); one OpenMP task per (run of query rows, head), where a run is a batch row,
// or consecutive single-row batch rows that read the same key/value sequence (a prefill chunk of
// one KV-cache slot). Tiny calls run on the calling thread.
#include <omp.h>

#include <cmath>

#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/cpu/cpu_attention_common.h"

namespace megatron::ops::cpu {

namespace {

void check_int_tensor(const char* op, const char* name, const Tensor& t, int64_t numel,
                      const char* shape) {
  require_host(op, t);
  MG_CHECK(t.dtype() == DType::I32 && t.is_contiguous() && t.numel() == numel, op, ": ", name,
           " must be contiguous int32 ", shape, " (", numel, " elements), got ",
           dtype_name(t.dtype()), " ", shape_str(t.shape()));
}

HeadOperand operand(const char* op, const char* name, const Tensor& t, const HeadLayout& L,
                    int64_t seqs, int64_t rows, int heads, int64_t d, bool input = false) {
  const bool half = input && t.defined() && t.dtype() == DType::BF16 && t.is_contiguous();
  if (!half) require_f32(op, name, t);
  require_host(op, t);
  check_head_operand(op, name, t, L, seqs, rows, heads, d);
  if (half) return HeadOperand{nullptr, L, d, t.data<bf16>()};
  return HeadOperand{t.data<float>(), L, d};
}

}  // namespace

HeadOperand grad_operand(const char* op, const char* name, const Tensor& t, const HeadLayout& L,
                         int64_t seqs, int64_t rows, int heads, int64_t d) {
  return operand(op, name, t, L, seqs, rows, heads, d);
}

void require_shape(const char* op, const char* name, const Tensor& t, int64_t numel) {
  require_f32(op, name, t);
  MG_CHECK(t.numel() == numel, op, ": ", name, " ", shape_str(t.shape()), " must have ", numel,
           " elements");
}

AttentionPlan make_plan(const char* op, const AttentionInputs& in, const AttentionMask& mask,
                        const AttentionShape& sh) {
  AttentionPlan P;
  static_cast<AttentionDims&>(P) = attention_dims(op, mask, sh);
  if (mask.alibi) {
    const std::vector<float> all = alibi_slopes(P.total_heads);
    P.slopes.assign(all.begin() + P.head_offset, all.begin() + P.head_offset + P.n);
  }
  // Key/value sequences: the batch rows' own, or those kv_index names.
  int64_t kv_seqs = P.b;
  if (in.kv_index.defined()) {
    check_int_tensor(op, "kv_index", in.kv_index, P.b, "[batch]");
    P.kv_index = in.kv_index.data<int32_t>();
    kv_seqs = 0;
    for (int64_t i = 0; i < P.b; ++i) {
      MG_CHECK(P.kv_index[i] >= 0, op, ": kv_index[", i, "] = ", P.kv_index[i], " is negative");
      kv_seqs = std::max<int64_t>(kv_seqs, P.kv_index[i] + 1);
    }
  }
  P.q = operand(op, "q", in.q, in.q_layout, P.b, P.sq, P.n, P.d, true);
  P.k = operand(op, "k", in.k, in.k_layout, kv_seqs, P.skv, P.g, P.d, true);
  P.v = operand(op, "v", in.v, in.v_layout, kv_seqs, P.skv, P.g, P.d, true);
  MG_CHECK(in.q.dtype() == in.k.dtype() && in.q.dtype() == in.v.dtype(), op, ": q, k and v must "
           "have one dtype (all float32, or all bfloat16 for the bf16 kernel), got ",
           dtype_name(in.q.dtype()), ", ", dtype_name(in.k.dtype()), ", ", dtype_name(in.v.dtype()));
  if (in.q_positions.defined()) {
    P.qpos_per_row = in.q_positions.numel() != P.sq || P.b == 1;
    check_int_tensor(op, "q_positions", in.q_positions, P.qpos_per_row ? P.b * P.sq : P.sq,
                     "[seq] or [batch, seq]");
    P.qpos = in.q_positions.data<int32_t>();
    for (int64_t i = 0; i < in.q_positions.numel(); ++i)
      MG_CHECK(P.qpos[i] >= 0 && P.qpos[i] < P.q_span, op, ": q_positions[",
               i, "] = ", P.qpos[i], " outside [0, ", P.q_span, ")");
  } else {
    MG_CHECK(P.sq <= P.q_span, op, ": ", P.sq, " query rows exceed q_span ", P.q_span);
  }
  if (in.kv_positions.defined()) {
    check_int_tensor(op, "kv_positions", in.kv_positions, P.skv, "[kv_seq]");
    P.kpos = in.kv_positions.data<int32_t>();
    for (int64_t j = 0; j < P.skv; ++j) {
      MG_CHECK(P.kpos[j] >= 0 && P.kpos[j] < P.kv_span, op, ": kv_positions[", j, "] = ",
               P.kpos[j], " outside [0, ", P.kv_span, ")");
      MG_CHECK(j == 0 || P.kpos[j] > P.kpos[j - 1], op, ": kv_positions must be ascending");
    }
  } else {
    MG_CHECK(P.skv <= P.kv_span, op, ": ", P.skv, " key rows exceed kv_span ", P.kv_span);
  }
  if (mask.attention_start.defined()) {
    check_int_tensor(op, "attention_start", mask.attention_start, P.b * P.sq, "[batch, seq]");
    P.start = mask.attention_start.data<int32_t>();
  }
  if (mask.key_padding.defined()) {
    require_host(op, mask.key_padding);
    MG_CHECK(mask.key_padding.dtype() == DType::I32 && mask.key_padding.is_contiguous() &&
                 mask.key_padding.numel() % P.kv_span == 0 &&
                 mask.key_padding.numel() / P.kv_span >= kv_seqs,
             op, ": key_padding must be contiguous int32 [kv sequences (", kv_seqs, "), kv_span (",
             P.kv_span, ")], got ", shape_str(mask.key_padding.shape()));
    P.pad = mask.key_padding.data<int32_t>();
  }
  if (in.bias.defined()) {
    require_f32(op, "bias", in.bias);
    P.bias_batch = attention_bias_batch(op, in.bias, P);
    P.bias = in.bias.data<float>();
  }
  return P;
}

void add_score_terms(const AttentionPlan& P, float* row, int64_t b0, int64_t v0, int64_t v1,
                     const float* bias, float slope, int64_t p) {
  float* r = row - b0;  // r[j] is key row j's score
  if (bias) {
    if (P.kpos) {
      for (int64_t j = v0; j < v1; ++j) r[j] += bias[P.kpos[j]];
    } else {
      for (int64_t j = v0; j < v1; ++j) r[j] += bias[j];
    }
  }
  if (!P.slopes.empty())
    for (int64_t j = v0; j < v1; ++j) r[j] += slope * float(P.k_position(j) - p);
}

float visible_max(const AttentionPlan& P, const float* row, int64_t b0, int64_t v0, int64_t v1,
                  const int32_t* pad) {
  const float* r = row - b0;
  float mx = kNegInf;
  if (pad) {
    for (int64_t j = v0; j < v1; ++j)
      if (pad[P.k_position(j)] != 0) mx = std::max(mx, r[j]);
  } else {
#pragma omp simd reduction(max : mx)
    for (int64_t j = v0; j < v1; ++j) mx = std::max(mx, r[j]);
  }
  return mx;
}

void dropped_probs(const AttentionPlan& P, const float* S, int64_t ld, const Run& run, int64_t t0,
                   int64_t nt, int h, int64_t b0, int64_t bw, const int64_t* lo,
                   const int64_t* hi, const DropoutSpec& dropout, const Philox& rng, float* keep,
                   float* pd) {
  const int64_t sq = P.sq, b1 = b0 + bw;
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t bi = sq == 1 ? run.bi + t0 + t : run.bi, i = sq == 1 ? 0 : run.i0 + t0 + t;
    const float* row = S + t * ld;
    float* dst = pd + t * bw;
    const int64_t v0 = std::max(lo[t], b0), v1 = std::min(hi[t], b1);
    std::fill_n(dst, bw, 0.0f);
    if (v1 <= v0) continue;
    dropout_keep(P, keep, v0, v1, P.dropout_first(bi, h, P.q_position(bi, i), dropout), rng,
                 dropout.p);
    for (int64_t j = v0; j < v1; ++j) dst[j - b0] = row[j - b0] * keep[j - v0];
  }
}

void online_softmax_step(const AttentionPlan& P, float* row, int64_t b0, int64_t bw, int64_t v0,
                         int64_t v1, int64_t bi, int h, int64_t i, float slope, float& m, float& l,
                         float* o, bool later_block) {
  const int64_t p = P.q_position(bi, i);
  const int32_t* pad = P.pad_row(bi);
  float mx = kNegInf;
  if (v1 > v0) {
    add_score_terms(P, row, b0, v0, v1, P.bias_row(bi, h, p), slope, p);
    mx = visible_max(P, row, b0, v0, v1, pad);
  }
  if (mx == kNegInf) {  // nothing visible in this block
    std::fill_n(row, bw, 0.0f);
    return;
  }
  const float m_new = std::max(m, mx);
  const float alpha = m == kNegInf ? 0.0f : fast_exp(m - m_new);
  float sum = 0;
  float* r = row - b0;
  std::fill(row, r + v0, 0.0f);
  if (pad) {
    for (int64_t j = v0; j < v1; ++j) {
      const float e = pad[P.k_position(j)] != 0 ? fast_exp(r[j] - m_new) : 0.0f;
      r[j] = e;
      sum += e;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = v0; j < v1; ++j) {
      r[j] = fast_exp(r[j] - m_new);
      sum += r[j];
    }
  }
  std::fill(r + v1, row + bw, 0.0f);
  l = l * alpha + sum;
  if (later_block && alpha != 1.0f)  // earlier blocks' output, under the old maximum
    for (int64_t e = 0; e < P.d; ++e) o[e] *= alpha;
  m = m_new;
}

void dropout_keep(const AttentionPlan& P, float* keep, int64_t v0, int64_t v1, uint64_t first,
                  const Philox& rng, float prob) {
  for (int64_t j = v0; j < v1;) {
    int64_t e = j + 1;
    if (P.kpos) {
      while (e < v1 && P.kpos[e] == P.kpos[e - 1] + 1) ++e;
    } else {
      e = v1;
    }
    dropout_row(keep + (j - v0), e - j, first + uint64_t(P.k_position(j)), rng, prob);
    j = e;
  }
}

namespace {

constexpr int64_t kTileRows = 64, kKeyBlock = 512;

}  // namespace

std::vector<Run> make_runs(const AttentionPlan& P) {
  std::vector<Run> runs;
  for (int64_t bi = 0; bi < P.b; ++bi) {
    if (P.sq == 1 && !runs.empty()) {
      Run& last = runs.back();
      const int64_t prev = last.bi + last.rows - 1;
      if (P.kv_seq_of(prev) == P.kv_seq_of(bi)) {
        ++last.rows;
        continue;
      }
    }
    if (P.sq > 0) runs.push_back({bi, 0, P.sq});
  }
  return runs;
}

namespace {

// Per-thread work space of the forward.
struct Scratch {
  WorkBuffer s, pd, keep;
  std::vector<float> m, l;
  std::vector<int64_t> lo, hi;
  // Tiles of up to `rows` query rows against key blocks of up to `block` keys.
  Scratch(int64_t rows, int64_t block)
      : s(rows * block), pd(rows * block), keep(block), m(size_t(rows)), l(size_t(rows)),
        lo(size_t(rows)), hi(size_t(rows)) {}
};

struct Forward {
  const AttentionPlan& P;
  float* out;
  float* lse;
  float* probs;
  const DropoutSpec& dropout;
  Philox rng;
  int64_t ctx_width;

  // Query row t of a run: its batch row and row within it.
  static int64_t row_bi(const Run& r, int64_t t, int64_t sq) { return sq == 1 ? r.bi + t : r.bi; }
  static int64_t row_i(const Run& r, int64_t t, int64_t sq) { return sq == 1 ? 0 : r.i0 + t; }

  void run_task(const Run& run, int h, Scratch& w) const {
    const int64_t sq = P.sq, kvs = P.kv_seq_of(run.bi);
    const int grp = h / P.hpg;
    const int64_t q_ld = sq == 1 ? P.q.L.seq_stride : P.q.L.row_stride;
    const int64_t p_ld = sq == 1 ? int64_t(P.n) * P.skv : P.skv;  // probs rows
    const float slope = P.slopes.empty() ? 0.0f : P.slopes[size_t(h)];
    for (int64_t t0 = 0; t0 < run.rows; t0 += kTileRows) {
      const int64_t nt = std::min(kTileRows, run.rows - t0);
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
      float* O = out + (bi0 * sq + i0) * ctx_width + int64_t(h) * P.d;
      float* Pp = probs ? probs + ((bi0 * P.n + h) * sq + i0) * P.skv : nullptr;
      if (k1 <= k0) k0 = k1 = 0;
      const float* Q = P.q.at(bi0, i0, h);
      const int64_t block = Pp ? std::max<int64_t>(k1 - k0, 1) : kKeyBlock;
      for (int64_t b0 = k0; b0 < k1; b0 += block) {
        const int64_t b1 = std::min(k1, b0 + block), bw = b1 - b0;
        float* S = Pp ? Pp + b0 : w.s.data();
        const int64_t ld = Pp ? p_ld : bw;
        const float* K = P.k.at(kvs, b0, grp);
        const float* V = P.v.at(kvs, b0, grp);
        if (nt == 1) {
          matvec(false, {K, DType::F32, bw, P.d, P.k.L.row_stride}, Q, 1, P.scale, 0.0f, S, 1);
        } else {
          sgemm(false, true, nt, bw, P.d, P.scale, Q, q_ld, K, P.k.L.row_stride, 0.0f, S,
                ld);
        }
        for (int64_t t = 0; t < nt; ++t) {
          const int64_t bi = row_bi(run, t0 + t, sq), i = row_i(run, t0 + t, sq);
          float* row = S + t * ld;
          const int64_t v0 = std::max(w.lo[size_t(t)], b0), v1 = std::min(w.hi[size_t(t)], b1);
          online_softmax_step(P, row, b0, bw, v0, v1, bi, h, i, slope, w.m[size_t(t)],
                              w.l[size_t(t)], O + t * ctx_width, b0 > k0);
        }
        const float* A = S;
        int64_t lda = ld;
        if (dropout.active()) {
          dropped_probs(P, S, ld, run, t0, nt, h, b0, bw, w.lo.data(), w.hi.data(), dropout, rng,
                        w.keep.data(), w.pd.data());
          A = w.pd.data();
          lda = bw;
        }
        const float beta = b0 > k0 ? 1.0f : 0.0f;
        if (nt == 1) {
          matvec(true, {V, DType::F32, bw, P.d, P.v.L.row_stride}, A, 1, 1.0f, beta, O, 1);
        } else {
          sgemm(false, false, nt, P.d, bw, 1.0f, A, lda, V, P.v.L.row_stride, beta, O, ctx_width);
        }
      }
      for (int64_t t = 0; t < nt; ++t) {  // normalise; rows that saw nothing get zeros
        const int64_t bi = row_bi(run, t0 + t, sq), i = row_i(run, t0 + t, sq);
        float* o = O + t * ctx_width;
        const float l = w.l[size_t(t)];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t e = 0; e < P.d; ++e) o[e] = l > 0.0f ? o[e] * inv : 0.0f;
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

void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& probs,
                   const AttentionInputs& in, const AttentionMask& mask,
                   const AttentionShape& shape, const DropoutSpec& dropout) {
  const char* op = "attention_fwd";
  const AttentionPlan P = make_plan(op, in, mask, shape);
  const int64_t ctx_width = int64_t(P.n) * P.d;
  require_shape(op, "out", out, P.b * P.sq * ctx_width);
  if (lse.defined()) require_shape(op, "lse", lse, P.b * P.n * P.sq);
  if (probs.defined()) require_shape(op, "probs", probs, P.b * P.n * P.sq * P.skv);
  if (P.q.base16) return attention_fwd_bf16(P, out, lse, probs, dropout);
  const Forward f{P, out.data<float>(), lse.defined() ? lse.data<float>() : nullptr,
                  probs.defined() ? probs.data<float>() : nullptr, dropout,
                  Philox(dropout.seed, dropout.stream), ctx_width};
  const std::vector<Run> runs = make_runs(P);
  const int64_t tasks = int64_t(runs.size()) * P.n;
  int64_t rows = 1;  // the largest tile
  for (const Run& r : runs) rows = std::max(rows, std::min(kTileRows, r.rows));
  const int64_t keys = std::max<int64_t>(P.skv, 1);
  const int64_t block = probs.defined() ? keys : std::min(kKeyBlock, keys);
  blas_single_threaded();
  if (P.b * P.sq * P.skv * ctx_width <= kMinParallelWork) {  // on this thread, no OpenMP region
    Scratch w(rows, block);
    for (int64_t task = 0; task < tasks; ++task)
      f.run_task(runs[size_t(task / P.n)], int(task % P.n), w);
    return;
  }
#pragma omp parallel
  {
    Scratch w(rows, block);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task)
      f.run_task(runs[size_t(task / P.n)], int(task % P.n), w);
  }
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                     const Tensor& lse_b, const AttentionShape& sh) {
  const char* op = "attention_merge";
  const int64_t b = sh.batch, sq = sh.seq, n = sh.heads, d = sh.head_dim, w = n * d;
  require_shape(op, "out", out, b * sq * w);
  require_shape(op, "out_b", out_b, b * sq * w);
  require_shape(op, "lse", lse, b * n * sq);
  require_shape(op, "lse_b", lse_b, b * n * sq);
  float* o = out.data<float>();
  float* l = lse.data<float>();
  const float* ob = out_b.data<float>();
  const float* lb = lse_b.data<float>();
  parallel_for(b * n, b * sq * w, [&](int64_t task) {
    const int64_t bi = task / n, head = task % n;
    for (int64_t i = 0; i < sq; ++i) {
      const float a = l[task * sq + i], c = lb[task * sq + i];
      if (c == kNegInf) continue;  // the partial result adds nothing
      float wa = 0, wb = 1, m = c;
      if (a != kNegInf) {
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
  });
}

}  // namespace megatron::ops::cpu
