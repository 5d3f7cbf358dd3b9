// The CPU core attention's plan, shared by its forward (cpu_attention.cpp) and backward
// (cpu_attention_bwd.cpp): the call's arguments checked once and turned into raw pointers and
// strides, each query row's position and visible key range, and the per-row helpers for the mask
// (key padding), the additive bias, ALiBi and the dropout stream. Key positions are ascending, so
// the keys a query row may see (before key padding) are one range [lo, hi) of key rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/attention_args.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_matmul.h"  // cpu::sgemm: oneDNN, single-threaded inside the callers' OpenMP tasks

namespace megatron::ops::cpu {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A per-thread work buffer, left uninitialised (every use writes before it reads).
struct WorkBuffer {
  std::unique_ptr<float[]> p;
  explicit WorkBuffer(int64_t n) : p(std::make_unique_for_overwrite<float[]>(size_t(n))) {}
  float* data() const { return p.get(); }
};

// One operand read (or written) through its HeadLayout: fp32 (base), or a bf16 input (base16,
// base null: the bf16 kernel of cpu_attention_bf16.cpp reads it).
struct HeadOperand {
  float* base = nullptr;
  HeadLayout L;
  int64_t d = 0;
  bf16* base16 = nullptr;
  int64_t index(int64_t seq, int64_t row, int head) const {
    return L.offset + seq * L.seq_stride + row * L.row_stride +
           int64_t(head / L.heads_per_group) * L.group_stride +
           int64_t(head % L.heads_per_group) * d;
  }
  float* at(int64_t seq, int64_t row, int head) const { return base + index(seq, row, head); }
  const bf16* at16(int64_t seq, int64_t row, int head) const {
    return base16 + index(seq, row, head);
  }
};

struct AttentionPlan : AttentionDims {
  std::vector<float> slopes;  // ALiBi slope of each local head, or empty
  HeadOperand q, k, v;
  const int32_t* qpos = nullptr;  // [sq] or [b, sq] (qpos_per_row), or null: i
  bool qpos_per_row = false;
  const int32_t* kpos = nullptr;      // [skv] ascending, or null: j
  const int32_t* kv_index = nullptr;  // [b], or null: b
  const int32_t* start = nullptr;     // [b, sq]
  const int32_t* pad = nullptr;       // [kv sequences, kv_span]
  const float* bias = nullptr;        // [bias_batch, n, q_span, kv_span]
  int64_t bias_batch = 0;

  int64_t q_position(int64_t bi, int64_t i) const {
    return qpos ? qpos[qpos_per_row ? bi * sq + i : i] : i;
  }
  int64_t k_position(int64_t j) const { return kpos ? kpos[j] : j; }
  int64_t kv_seq_of(int64_t bi) const { return kv_index ? kv_index[bi] : bi; }
  // Key rows [lo, hi) that query row i of batch row bi may see, before key padding.
  void key_range(int64_t bi, int64_t i, int64_t& lo, int64_t& hi) const {
    const int64_t p = q_position(bi, i);
    int64_t first = start ? start[bi * sq + i] : 0;
    if (window_left >= 0) first = std::max(first, p - window_left);
    const bool bounded = causal || window_right >= 0;
    const int64_t last = causal ? p : p + window_right;  // inclusive, when bounded
    if (kpos) {
      lo = std::lower_bound(kpos, kpos + skv, first) - kpos;
      hi = bounded ? std::upper_bound(kpos, kpos + skv, last) - kpos : skv;
    } else {
      lo = std::clamp<int64_t>(first, 0, skv);
      hi = bounded ? std::clamp<int64_t>(last + 1, 0, skv) : skv;
    }
    if (hi < lo) hi = lo;
  }
  // Key padding of the kv sequence of batch row bi, indexed by key position; null without.
  const int32_t* pad_row(int64_t bi) const { return pad ? pad + kv_seq_of(bi) * kv_span : nullptr; }
  // Bias row of (bi, local head h, query position p), indexed by key position; null without.
  const float* bias_row(int64_t bi, int h, int64_t p) const {
    if (!bias) return nullptr;
    return bias + ((int64_t(bias_batch == 1 ? 0 : bi) * n + h) * q_span + p) * kv_span;
  }
  // First Philox element of the dropout row of (bi, local head h, query position p).
  uint64_t dropout_first(int64_t bi, int h, int64_t p, const DropoutSpec& dr) const {
    return dr.element_offset +
           uint64_t(((bi * total_heads + head_offset + h) * q_span + p) * kv_span);
  }
};

// Consecutive query rows that read one key/value sequence through one row stride: a batch row,
// or consecutive single-row batch rows of one key/value sequence (a prefill chunk of one KV-cache
// slot). The forward runs one task per (run, head).
struct Run {
  int64_t bi, i0, rows;
};
std::vector<Run> make_runs(const AttentionPlan& P);

// Checks the call (fp32 operands, or q, k and v all bf16, layouts inside their tensors, positions, masks) and builds the
// plan; `op` names the caller in messages.
AttentionPlan make_plan(const char* op, const AttentionInputs& in, const AttentionMask& mask,
                        const AttentionShape& shape);
// Checks a [rows, heads * d] or per-head tensor of the plan's size.
void require_shape(const char* op, const char* name, const Tensor& t, int64_t numel);
// A gradient operand with an input's layout, bounds checked like it.
HeadOperand grad_operand(const char* op, const char* name, const Tensor& t, const HeadLayout& L,
                         int64_t seqs, int64_t rows, int heads, int64_t d);

// Scores of one query row over key rows [b0, b1) (row[j - b0]) -> what softmax sees: the bias and
// ALiBi added on the visible keys [v0, v1) (bias: the row's bias row or null).
void add_score_terms(const AttentionPlan& P, float* row, int64_t b0, int64_t v0, int64_t v1,
                     const float* bias, float slope, int64_t p);
// The maximum of row[j - b0] over the visible keys [v0, v1) that are not padding (pad: the key
// padding row or null); -inf when there is none.
float visible_max(const AttentionPlan& P, const float* row, int64_t b0, int64_t v0, int64_t v1,
                  const int32_t* pad);
// Online-softmax step of score row `row` (query row i of batch row bi, head h) over key block
// [b0, b0 + bw) whose visible keys are [v0, v1): the score terms added, exponentials in place
// (zeros outside the visible keys), the running maximum m and sum l updated, and the output row o
// rescaled when the maximum grows in a later block. A block with nothing visible is all zeros.
void online_softmax_step(const AttentionPlan& P, float* row, int64_t b0, int64_t bw, int64_t v0,
                         int64_t v1, int64_t bi, int h, int64_t i, float slope, float& m, float& l,
                         float* o, bool later_block);
// The dropout keep factors (0 or 1/(1-p)) of key rows [v0, v1) for the dropout row starting at
// Philox element `first`: keep[j - v0], drawn run by run of consecutive key positions.
void dropout_keep(const AttentionPlan& P, float* keep, int64_t v0, int64_t v1, uint64_t first,
                  const Philox& rng, float prob);

// With dropout: the probabilities S ([nt, ld] rows of query rows t0 .. t0 + nt of `run`, head h,
// key block [b0, b0 + bw); lo, hi: each row's visible keys) times their keep factors into pd
// ([nt, bw], zeros outside the visible keys); keep: work space of bw.
void dropped_probs(const AttentionPlan& P, const float* S, int64_t ld, const Run& run, int64_t t0,
                   int64_t nt, int h, int64_t b0, int64_t bw, const int64_t* lo,
                   const int64_t* hi, const DropoutSpec& dropout, const Philox& rng, float* keep,
                   float* pd);

// ---- backward, per query tile (rows t0 .. t0 + nt of batch row bi, head h) and key block
// [b0, b1); lo, hi: each tile row's visible key range; S, dP, pd: [nt, b1 - b0] --------------------
// The probabilities from the scores S (in place) and the rows' saved log-sum-exp lrow.
void recompute_probs(const AttentionPlan& P, float* S, int64_t bi, int h, int64_t t0, int64_t nt,
                     int64_t b0, int64_t b1, float slope, const float* lrow, const int64_t* lo,
                     const int64_t* hi);
struct GradBlock {
  float* dp;           // dP = dO V^T in, dS = P (keep dP - D) out
  const float* probs;  // P, rows ldp apart
  int64_t ldp;
  float* pd;           // with dropout: P * keep out; else null
  const float* delta;  // D of the tile's rows
  float* keep;         // work space of b1 - b0
  const int64_t *lo, *hi;
};
// dS in place of dP, Pd with dropout, and dS added to the bias gradient rows (dbias: the bias
// gradient, or per-batch-row parts when dbias_per_row; null: none).
void softmax_grad_block(const AttentionPlan& P, const GradBlock& g, int64_t bi, int h, int64_t t0,
                        int64_t nt, int64_t b0, int64_t b1, const DropoutSpec& dropout,
                        const Philox& rng, float* dbias, bool dbias_per_row);

}  // namespace megatron::ops::cpu
