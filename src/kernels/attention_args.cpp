// See attention_args.h.
#include "kernels/attention_args.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::ops {

AttentionDims attention_dims(const char* op, const AttentionMask& mask, const AttentionShape& sh) {
  AttentionDims P;
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0 && sh.head_dim > 0, op,
           ": heads ", sh.heads, " must be a positive multiple of groups ", sh.groups,
           " (head_dim ", sh.head_dim, ")");
  MG_CHECK(sh.batch >= 0 && sh.seq >= 0 && sh.kv_seq >= 0, op, ": negative sizes");
  P.b = sh.batch;
  P.sq = sh.seq;
  P.skv = sh.kv_seq > 0 ? sh.kv_seq : sh.seq;
  P.q_span = sh.q_span > 0 ? sh.q_span : P.sq;
  P.kv_span = sh.kv_span > 0 ? sh.kv_span : P.skv;
  P.n = sh.heads;
  P.g = sh.groups;
  P.hpg = sh.heads / sh.groups;
  P.d = sh.head_dim;
  P.scale = sh.softmax_scale;
  P.total_heads = sh.total_heads > 0 ? sh.total_heads : sh.heads;
  P.head_offset = sh.head_offset;
  MG_CHECK(P.head_offset >= 0 && P.head_offset + P.n <= P.total_heads, op, ": heads [",
           P.head_offset, ", ", P.head_offset + P.n, ") outside the layer's ", P.total_heads);
  MG_CHECK(mask.window_left >= -1 && mask.window_right >= -1, op, ": windows must be -1 or >= 0 (",
           mask.window_left, ", ", mask.window_right, ")");
  MG_CHECK(!mask.causal || mask.window_right <= 0, op, ": window_right ", mask.window_right,
           " needs bidirectional attention (causal = false)");
  P.causal = mask.causal;
  P.window_left = mask.window_left;
  P.window_right = mask.causal ? -1 : mask.window_right;
  return P;
}

int64_t head_layout_extent(const HeadLayout& L, int64_t seqs, int64_t rows, int heads, int64_t d) {
  const int hg = std::max(L.heads_per_group, 1);
  return L.offset + (seqs - 1) * L.seq_stride + (rows - 1) * L.row_stride +
         int64_t((heads - 1) / hg) * L.group_stride + int64_t((heads - 1) % hg) * d + d;
}

void check_head_operand(const char* op, const char* name, const Tensor& t, const HeadLayout& L,
                        int64_t seqs, int64_t rows, int heads, int64_t d) {
  MG_CHECK(L.heads_per_group >= 1 && L.offset >= 0 && L.seq_stride >= 0 && L.row_stride >= 0 &&
               L.group_stride >= 0,
           op, ": ", name, "'s head layout has a negative stride or offset");
  MG_CHECK(seqs <= 0 || rows <= 0 || head_layout_extent(L, seqs, rows, heads, d) <= t.numel(), op,
           ": ", name, " ", shape_str(t.shape()), " is too small for ", seqs, " sequences of ",
           rows, " rows of ", heads, " heads of ", d, " through its layout (needs ",
           head_layout_extent(L, seqs, rows, heads, d), " elements)");
}

int64_t attention_bias_batch(const char* op, const Tensor& bias, const AttentionDims& P) {
  const int64_t per = int64_t(P.n) * P.q_span * P.kv_span;
  MG_CHECK(bias.numel() == per || bias.numel() == P.b * per, op, ": bias ",
           shape_str(bias.shape()), " must be [1 or batch ", P.b, ", heads ", P.n, ", q_span ",
           P.q_span, ", kv_span ", P.kv_span, "]");
  return per > 0 ? bias.numel() / per : 1;
}

}  // namespace megatron::ops
