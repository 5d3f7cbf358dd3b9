// The op interface: one function per operation, taking Tensors (never raw pointers) so that a
// device backend can be chosen from the tensors' device. Only the CPU backend exists
// (src/kernels/cpu/: OpenMP over rows, OpenBLAS sgemm for matrix products); each op checks its
// tensors' device and throws megatron::Error for a device this build cannot run.
// Conventions: compute tensors are fp32 and contiguous unless stated ("2-D with unit inner
// stride" allows row-strided views); outputs are written, "accumulates" means +=.
// Dropout masks come from the counter-based Philox RNG: element k of (seed, stream) is kept iff
// Philox(seed, stream).uniform(k) >= p, so masks do not depend on threads or recomputation.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace megatron::ops {

// ---- matrix products -------------------------------------------------------------------------
// c = alpha * op(a) @ op(b) + beta * c. a, b, c: 2-D fp32 with unit inner stride (row stride is
// the leading dimension, so column blocks of a wider matrix are valid operands).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);
// Batched over dim 0 of 3-D operands ([batch, rows, cols], unit inner stride; a zero batch stride
// broadcasts an operand).
void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha = 1.0f, float beta = 0.0f);

// ---- embedding --------------------------------------------------------------------------------
// out[i, :] = weight[ids[i], :]; ids int32 [n] (any shape, flattened); out [n, h]; weight [V, h].
// An id outside [0, V) throws Error naming the id and row.
void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight);
// dweight[ids[i], :] += dout[i, :] (deterministic: rows of dweight are owned by one thread and
// visited in token order).
void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout);
// Vocab-parallel lookup (Megatron's VocabParallelEmbedding): weight holds vocabulary rows
// [vocab_start, vocab_start + V) of the full table; ids outside that range give zero rows in
// forward and nothing in backward (another tensor-parallel rank owns them). Any id is accepted.
void vocab_parallel_embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight,
                                  int64_t vocab_start);
void vocab_parallel_embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                                  int64_t vocab_start);

// ---- LayerNorm over the last dim ----------------------------------------------------------------
// x, out [n, h]; weight, bias [h]; mean, rstd [n] (saved for backward).
void layernorm_fwd(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                   const Tensor& weight, const Tensor& bias, float eps);
// dx written (accumulated when accumulate_dx); dweight, dbias accumulate.
void layernorm_bwd(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                   const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                   const Tensor& rstd, bool accumulate_dx = false);

// ---- GELU (tanh approximation or exact erf) ---------------------------------------------------
void gelu_fwd(const Tensor& out, const Tensor& x, bool tanh_approx);
void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx);

// ---- bias, residual, scale ----------------------------------------------------------------------
void bias_add(const Tensor& x, const Tensor& bias);         // x [n, m] += bias [m] (in place)
void bias_grad(const Tensor& dbias, const Tensor& dout);    // dbias [m] += sum_rows dout [n, m]
void add(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias)
void scale(const Tensor& x, float s);                         // x *= s (in place)

// ---- dropout ------------------------------------------------------------------------------------
struct DropoutSpec {
  float p = 0.0f;       // drop probability; 0 = identity
  uint64_t seed = 0;
  uint64_t stream = 0;  // distinct per (micro-batch, layer, site)
  // Philox index of the tensor's first element within the stream: a shard of a larger tensor
  // (sequence parallelism) passes its first element's index in the whole tensor, so its mask
  // is the matching slice of the unsharded mask.
  uint64_t element_offset = 0;
  bool active() const { return p > 0.0f; }
};
void dropout_fwd(const Tensor& out, const Tensor& x, const DropoutSpec& d);     // out may alias x
void dropout_bwd(const Tensor& dx, const Tensor& dout, const DropoutSpec& d);   // dx may alias
// out = residual + dropout(x + bias) (Megatron's bias-dropout-add); bias [m] or undefined.
void bias_dropout_add_fwd(const Tensor& out, const Tensor& x, const Tensor& bias,
                          const Tensor& residual, const DropoutSpec& d);
// Backward of the above for the x branch: dx = dropout_bwd(dout); dbias += colsum(dx).
// (The residual branch's gradient is dout itself.)
void bias_dropout_add_bwd(const Tensor& dx, const Tensor& dbias, const Tensor& dout,
                          const DropoutSpec& d);

// ---- causal self-attention, fused per (batch, head) -----------------------------------------------
// qkv [b, s, g*(n/g+2)*d] in Megatron-Core layout: per query group, n/g query heads of d, then one
// key head, then one value head. ctx [b, s, n*d] (head-major columns). attention_start [b, s]
// int32 or undefined: query i attends keys j with start[i] <= j <= i (start 0 = plain causal).
// lse [b, n, s] is always written (row log-sum-exp of the scaled, masked scores). probs
// [b, n, s, s] is written when defined (pre-dropout softmax, saved for backward); leave it
// undefined to recompute the scores in backward (selective recompute).
struct AttentionShape {
  int64_t batch = 0, seq = 0;
  int heads = 0, groups = 0, head_dim = 0;
  float softmax_scale = 0.0f;  // usually 1/sqrt(head_dim)
  // Tensor parallelism: these `heads` are heads [head_offset, head_offset + heads) of a layer
  // with total_heads heads (0 = heads). Dropout masks are indexed by the global head, so they
  // do not depend on how heads are split across ranks.
  int head_offset = 0, total_heads = 0;
  // Query-subset ops: key positions of the whole sequence (seq = number of query rows).
  // Block ops: key rows of the block.
  int64_t kv_seq = 0;
  // Block ops only: length of the whole sequence the positions index.
  int64_t full_seq = 0;
  bool causal = true;
  int64_t window_left = -1;
  int64_t window_right = -1;
  bool alibi = false;
};
void attention_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs, const Tensor& qkv,
                   const Tensor& attention_start, const AttentionShape& shape,
                   const DropoutSpec& dropout, const Tensor& key_padding = Tensor());
// dqkv [b, s, qkv width] is written. probs may be undefined (then recomputed from qkv and lse).
void attention_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& lse,
                   const Tensor& probs, const Tensor& attention_start,
                   const AttentionShape& shape, const DropoutSpec& dropout,
                   const Tensor& key_padding = Tensor());
// The same for a subset of the query positions (context parallelism: this rank's tokens of a
// sequence split over ranks): qkv [b, kv_seq, width] holds the whole sequence in order;
// query_positions int32 [seq] the position of each of the seq query rows (the same for every
// sequence of the batch); ctx [b, seq, n*d], lse [b, n, seq], probs [b, n, seq, kv_seq] and
// attention_start [b, seq] (values in [0, position]) are per query row. Query row i equals row
// query_positions[i] of attention_fwd on the whole sequence, dropout masks included.
void attention_subset_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& probs,
                          const Tensor& qkv, const Tensor& query_positions,
                          const Tensor& attention_start, const AttentionShape& shape,
                          const DropoutSpec& dropout);
// dqkv [b, kv_seq, width] is written: dK and dV of every position (from these queries only), dQ
// at the query rows, zeros in the query columns of the other rows.
void attention_subset_bwd(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                          const Tensor& query_positions, const Tensor& lse, const Tensor& probs,
                          const Tensor& attention_start, const AttentionShape& shape,
                          const DropoutSpec& dropout);

// ---- blockwise attention (context parallelism's ring exchange, --cp-comm-type p2p) ----------------
// This rank's query rows against one block of key/value rows of the same sequences (its own or
// another rank's tokens); the blocks of all ranks, merged with attention_merge, give exactly
// attention_subset_fwd over the whole sequence. shape.seq = sq query rows, shape.kv_seq = skv
// key rows, shape.full_seq = S, the whole sequence (positions lie in [0, S); dropout masks are
// those of the whole S x S attention). q_qkv [b, sq, qkv width]: the queries' fused QKV rows (only
// the query columns are read). kv [b, skv, g*2*d]: per query group its key head then its value
// head (the key and value columns of fused QKV rows, packed). q_positions int32 [sq] and
// kv_positions int32 [skv]: the rows' positions in the sequence, both ascending. Query i attends
// key j iff start[i] <= kv_positions[j] <= q_positions[i] (attention_start [b, sq] or undefined).
// Writes ctx [b, sq, n*d], normalised over this block's keys, and lse [b, n, sq]; a row that
// sees no key of the block gets lse = -inf and zeros. Rows and keys that cannot meet (all keys
// after the last query, queries before the first key) are skipped, so a zig-zag block costs
// half of its square.
void attention_block_fwd(const Tensor& ctx, const Tensor& lse, const Tensor& q_qkv,
                         const Tensor& q_positions, const Tensor& kv, const Tensor& kv_positions,
                         const Tensor& attention_start, const AttentionShape& shape,
                         const DropoutSpec& dropout);
// Online-softmax merge of a block's (ctx_b [b, sq, n*d], lse_b [b, n, sq]) into the running
// (ctx, lse): lse <- log(e^lse + e^lse_b), ctx <- ctx e^(lse_old - lse) + ctx_b e^(lse_b - lse).
void attention_merge(const Tensor& ctx, const Tensor& lse, const Tensor& ctx_b, const Tensor& lse_b,
                     const AttentionShape& shape);
// delta [b, n, sq] = per head, the row sums of dctx * ctx (the final attention output): the
// softmax-backward term the blocks share.
void attention_delta(const Tensor& delta, const Tensor& dctx, const Tensor& ctx,
                     const AttentionShape& shape);
// Backward of one block, given the final lse and delta: ADDS dQ into the query columns of dq
// [b, sq, qkv width] and dK, dV into dkv [b, skv, g*2*d] (the caller zeroes them first).
void attention_block_bwd(const Tensor& dq, const Tensor& dkv, const Tensor& dctx,
                         const Tensor& q_qkv, const Tensor& q_positions, const Tensor& kv,
                         const Tensor& kv_positions, const Tensor& lse, const Tensor& delta,
                         const Tensor& attention_start, const AttentionShape& shape,
                         const DropoutSpec& dropout);

// ---- softmax cross-entropy over the vocab -------------------------------------------------------
// logits [n, V] fp32 (row-strided allowed), labels int32 [n], loss_mask fp32 [n] or undefined
// (all ones). Writes loss [n] (per-token, unmasked) and, when grad_scale_or_zero != 0, replaces
// logits in place by d(grad_scale * sum(loss * mask))/dlogits. A label outside [0, V) throws.
void softmax_xent_fwd_bwd(const Tensor& logits, const Tensor& loss, const Tensor& labels,
                          const Tensor& loss_mask, float grad_scale, bool write_grad);

// ---- optimizer ----------------------------------------------------------------------------------
struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
};
// Decoupled weight decay (AdamW / apex FusedAdam adam_w_mode):
//   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mh = m/(1-b1^t); vh = v/(1-b2^t)
//   p -= lr * (mh / (sqrt(vh) + eps) + wd * p)
// master, grad, exp_avg, exp_avg_sq fp32 (same numel); model_copy (fp32/bf16/fp16, same numel)
// receives the updated value when defined.
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& cfg);

// ---- reductions and casts -----------------------------------------------------------------------
double l2_norm_squared(const Tensor& x);  // sum of squares in double (any float dtype)
bool all_finite(const Tensor& x);          // false if any NaN/Inf (any float dtype)
void cast(const Tensor& dst, const Tensor& src);  // fp32/bf16/fp16/f64 <-> any (RNE), same numel

// PENDING (kernels work in progress)
void rmsnorm_fwd(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight, float eps);
void rmsnorm_bwd(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                 const Tensor& weight, const Tensor& rstd, bool accumulate_dx = false);
void swiglu_fwd(const Tensor& out, const Tensor& x);
void swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x);
void squared_relu_fwd(const Tensor& out, const Tensor& x);
void squared_relu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x);
struct RotaryConfig {
  int rotary_dim = 0;
  double base = 10000.0;
  bool interleaved = false;
};
void rope_fwd(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape, const RotaryConfig& rope);
void rope_bwd(const Tensor& dqkv, const Tensor& positions, const AttentionShape& shape, const RotaryConfig& rope);
void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos, const AttentionShape& shape);
void attention_kv_cache_fwd(const Tensor& ctx, const Tensor& qkv, const Tensor& k_cache,
                            const Tensor& v_cache, const Tensor& row_slot, const Tensor& row_pos,
                            const AttentionShape& shape);
void index_select_rows(const Tensor& out, const Tensor& in, const Tensor& index);
void index_copy_rows(const Tensor& out, const Tensor& in, const Tensor& index, bool accumulate = false);
double sum(const Tensor& x);
double dot(const Tensor& a, const Tensor& b);

}  // namespace megatron::ops
