// The core attention op's sizes and mask settings as every backend reads them: the call's
// AttentionShape and AttentionMask checked once (positive heads that the groups divide, non-negative
// sizes, the local heads inside the layer's, windows -1 or >= 0, no right window under causal
// attention) and resolved (kv_seq, q_span and kv_span of 0 take their defaults; the right window of
// a causal mask is -1). The CPU plan (cpu/cpu_attention_common.h) and the CUDA plan
// (cuda/attention_common.cuh) extend it with their operands.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace megatron::ops {

struct AttentionDims {
  int64_t b = 0, sq = 0, skv = 0, q_span = 0, kv_span = 0;
  int n = 0, g = 0, hpg = 0, d = 0, head_offset = 0, total_heads = 0;
  float scale = 0;
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
};

// Throws (naming `op`) when the sizes or the mask make no sense.
AttentionDims attention_dims(const char* op, const AttentionMask& mask, const AttentionShape& sh);

// The largest element offset + 1 that `seqs` sequences of `rows` rows of `heads` heads of `d`
// elements reach through the layout.
int64_t head_layout_extent(const HeadLayout& L, int64_t seqs, int64_t rows, int heads, int64_t d);

// Throws unless the layout has no negative stride or offset and `t` (operand `name`) holds every
// element it reaches.
void check_head_operand(const char* op, const char* name, const Tensor& t, const HeadLayout& L,
                        int64_t seqs, int64_t rows, int heads, int64_t d);

// The bias's batch (1 or P.b) after checking its size: [1 or batch, heads, q_span, kv_span].
int64_t attention_bias_batch(const char* op, const Tensor& bias, const AttentionDims& P);

}  // namespace megatron::ops
