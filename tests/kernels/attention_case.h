// One case of the core attention op for the kernel tests (attention_test.cpp for fp32,
// attention_bf16_test.cpp for bf16): the sizes, the mask, the bias, dropout, positions and the
// operand layout, and the float64 reference description and operand values built from it
// (attention_reference.h). Each test packs the values into the tensors its kernel reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "attention_reference.h"
#include "kernel_test_util.h"

namespace megatron::ops::testing {

// How queries, keys and values reach the kernel: one fused QKV tensor (self-attention), a
// separate query tensor against fused keys and values (cross-attention), or fused-QKV queries
// against a packed key/value block.
enum class Operands { FusedQkv, SeparateQFusedKv, QkvQueriesPackedKv };

struct AttentionCase {
  int64_t b = 1, sq = 4, skv = 0;  // skv 0: sq
  int n = 2, g = 1, d = 3;
  Operands operands = Operands::FusedQkv;
  bool causal = true, alibi = false;
  int64_t wl = -1, wr = -1;
  bool starts = false, padding = false;
  int bias = 0;  // 0 none, 1 broadcast over the batch, 2 per batch row
  float p = 0.0f;
  std::vector<int32_t> qpos = {}, kpos = {}, kv_index = {};  // empty: defaults
  int64_t q_span = 0, kv_span = 0;
  int head_offset = 0, total_heads = 0;
  bool finite_differences = true;  // the fp32 test: also against central differences
};

// The reference description and operand values of a case.
struct ReferenceCase {
  RefAttention a;
  RefValues x;
  int64_t kv_seqs = 0;  // key/value sequences (the largest kv_index + 1, else b)
};

// `values(n, stream)` draws the query, key and value operands (streams first_stream, +1, +2);
// the bias is normal from stream first_stream + 3.
inline ReferenceCase reference_case(const AttentionCase& c,
                                    const std::function<std::vector<double>(size_t, uint64_t)>& values,
                                    uint64_t first_stream) {
  ReferenceCase r;
  RefAttention& a = r.a;
  a.b = c.b;
  a.sq = c.sq;
  a.skv = c.skv > 0 ? c.skv : c.sq;
  a.n = c.n;
  a.g = c.g;
  a.d = c.d;
  a.scale = double(1.0f / std::sqrt(float(c.d)));
  a.q_span = c.q_span > 0 ? c.q_span : a.sq;
  a.kv_span = c.kv_span > 0 ? c.kv_span : a.skv;
  a.head_offset = c.head_offset;
  a.total_heads = c.total_heads;
  a.causal = c.causal;
  a.alibi = c.alibi;
  a.window_left = c.wl;
  a.window_right = c.wr;
  for (int64_t bi = 0; bi < c.b; ++bi) {
    a.kv_index.push_back(c.kv_index.empty() ? int32_t(bi) : c.kv_index[size_t(bi)]);
    for (int64_t i = 0; i < c.sq; ++i) a.qpos.push_back(c.qpos.empty() ? int32_t(i) : c.qpos[size_t(i)]);
  }
  for (int64_t j = 0; j < a.skv; ++j) a.kpos.push_back(c.kpos.empty() ? int32_t(j) : c.kpos[size_t(j)]);
  r.kv_seqs = c.kv_index.empty() ? c.b : *std::max_element(c.kv_index.begin(), c.kv_index.end()) + 1;
  if (c.starts)  // a document boundary at position 3 + b: later queries see keys from there on
    for (int64_t bi = 0; bi < c.b; ++bi)
      for (int64_t i = 0; i < c.sq; ++i) {
        const int32_t p = a.qpos[size_t(bi * c.sq + i)], s = int32_t(3 + bi);
        a.start.push_back(p >= s ? s : 0);
      }
  if (c.padding)  // sequence 0: its last two positions are padding; sequence 1: all of them
    for (int64_t s = 0; s < r.kv_seqs; ++s)
      for (int64_t k = 0; k < a.kv_span; ++k)
        a.pad.push_back(s == 0 ? (k < a.kv_span - 2 ? 1 : 0) : (s == 1 ? 0 : 1));
  a.bias_batch = c.bias == 0 ? 0 : (c.bias == 1 ? 1 : c.b);
  a.dropout = DropoutSpec{c.p, 5, 9, 17};
  r.x.q = values(size_t(c.b * c.sq * c.n * c.d), first_stream);
  r.x.k = values(size_t(r.kv_seqs * a.skv * c.g * c.d), first_stream + 1);
  r.x.v = values(size_t(r.kv_seqs * a.skv * c.g * c.d), first_stream + 2);
  r.x.bias = to_double(randn({a.bias_batch * c.n * a.q_span * a.kv_span}, first_stream + 3));
  return r;
}

// What the op takes beside the operand tensors, from a case: the query and key positions, the
// key/value sequence of each row, the bias (into `in`), the mask and the shape.
inline void set_case_arguments(const AttentionCase& c, const ReferenceCase& r, AttentionInputs& in,
                               AttentionMask& mask, AttentionShape& shape) {
  const RefAttention& a = r.a;
  if (!c.qpos.empty()) in.q_positions = Tensor::from_vector(c.qpos, {c.sq});
  if (!c.kpos.empty()) in.kv_positions = Tensor::from_vector(c.kpos, {a.skv});
  if (!c.kv_index.empty()) in.kv_index = Tensor::from_vector(c.kv_index, {c.b});
  if (c.bias) {
    const std::vector<float> bias(r.x.bias.begin(), r.x.bias.end());
    in.bias = Tensor::from_vector(bias, {a.bias_batch, c.n, a.q_span, a.kv_span});
  }
  mask.causal = c.causal;
  mask.window_left = c.wl;
  mask.window_right = c.wr;
  mask.alibi = c.alibi;
  if (c.starts) mask.attention_start = Tensor::from_vector(a.start, {c.b, c.sq});
  if (c.padding) mask.key_padding = Tensor::from_vector(a.pad, {r.kv_seqs, a.kv_span});
  shape = AttentionShape{.batch = c.b, .seq = c.sq, .heads = c.n, .groups = c.g, .head_dim = c.d,
                         .softmax_scale = float(a.scale), .head_offset = c.head_offset,
                         .total_heads = c.total_heads, .kv_seq = a.skv, .q_span = c.q_span,
                         .kv_span = c.kv_span};
}

}  // namespace megatron::ops::testing
