// The op interface: one function per operation, taking Tensors (never raw pointers). Each op
// finds its tensors' device (all on one device, else Error naming the op and the devices) and
// calls that device's backend through a table of function pointers (backend.h, as ggml's backend
// interface): the CPU (src/kernels/cpu/: OpenMP over rows, oneDNN for matrix products; the
// reference, every op), CUDA (src/kernels/cuda/, the ops it has kernels for; any other op
// throws Error naming the op and the device) and the checking device for tests
// (src/kernels/checked/: the CPU kernels over memory host code cannot read outside ops).
// tests/kernels/backend_ops_test.cpp runs every op on every backend against the CPU.
// Conventions: compute tensors are fp32 and contiguous unless stated ("2-D with unit inner
// stride" allows row-strided views); outputs are written, "accumulates" means +=.
// Dropout masks come from the counter-based Philox RNG: element k of (seed, stream) is kept iff
// Philox(seed, stream).uniform(k) >= p, so masks do not depend on threads or recomputation.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/op_kinds.h"

namespace megatron::ops {

// ---- matrix products ----------------------------------------------------------------------------
// c = alpha * op(a) @ op(b) + beta * c. a, b, c: 2-D with unit inner stride (row stride is the
// leading dimension, so column blocks of a wider matrix are valid operands). c is fp32; a and b
// are both fp32 (an fp32 product) or both bf16 (or both fp16): the products of those values
// accumulated in fp32, as a GPU's bf16 GEMM with fp32 output does (on the CPU: bf16 tiles or
// AVX512-BF16 where the CPU has them, the same products widened to fp32 elsewhere). A product
// with a single output row or column (decoding one token) runs as a matrix-vector product split
// across the threads.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);
// Whether gemm on `device` multiplies operands of `dtype` as they are: fp32 everywhere, bf16 on
// the CPU (fp16 where the CPU has AVX512-FP16 kernels). A layer whose weights have such a dtype
// passes them (and its inputs cast to that dtype) to gemm; otherwise it multiplies fp32 working
// copies. A host helper (not dispatched).
bool gemm_computes_in(DType dtype, Device device);
// Batched over dim 0 of 3-D operands ([batch, rows, cols], unit inner stride; a zero batch stride
// broadcasts an operand), dtypes as gemm.
void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha = 1.0f, float beta = 0.0f);

// ---- embedding ----------------------------------------------------------------------------------
// out[i, :] = weight[ids[i], :]; ids int32 [n] (any shape, flattened); out [n, h]; weight [V, h].
// An id outside [0, V) throws Error naming the id and row.
void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight);
// dweight[ids[i], :] += dout[i, :] (deterministic: rows of dweight are owned by one thread and
// visited in token order).
void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout);
// Vocab-parallel lookup (Megatron's VocabParallelEmbedding): weight holds vocabulary rows
// [vocab_start, vocab_start + V) of the full table; ids outside that range give zero rows in
// forward and nothing in backward (another tensor-parallel rank owns them). Any id is accepted.
// The forward's weight may be bf16 or fp16 (its rows widened to the fp32 out; CPU only).
void vocab_parallel_embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight,
                                  int64_t vocab_start);
void vocab_parallel_embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                                  int64_t vocab_start);

// ---- norms over the last dim (the NormOps of op_kinds.h) ------------------------------------
// One pair of ops for every NormOp (its row gives its formula); `kind` picks the kernel (a backend without one for the
// kind throws Error naming the op, the kind and the device). x, out [n, h]; weight [h] (the
// gamma the norm computes with: with --apply-layernorm-1p the caller passes stored + 1); bias [h]
// when the kind has_bias, else undefined; mean [n] when the kind saves_mean, else undefined;
// rstd [n]. mean and rstd are written for backward; either may be undefined when nothing is
// saved. out may alias x.
void norm_fwd(NormId kind, const Tensor& out, const Tensor& mean, const Tensor& rstd,
              const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
// dx [n, h] written (accumulated when accumulate_dx); dweight and dbias (undefined without a
// bias) accumulate. mean and rstd from the forward. dx may alias dout unless accumulating.
void norm_bwd(NormId kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
              const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
              const Tensor& rstd, bool accumulate_dx = false);

// ---- MLP activations (the ActivationOps of op_kinds.h) -----------------------------------------
// One pair of ops for every ActivationOp (its row gives its formula); `kind` picks the kernel
// (as the norms). A plain activation maps x to out elementwise (same shapes; out may alias x). A
// gated one takes rows of x [n, 2f] as [gate | up] (f columns each) and gives out [n, f]
// (SwiGLU: silu(gate) * up).
void activation_fwd(ActivationId kind, const Tensor& out, const Tensor& x);
// dx = dout * act'(x), dx with x's shape (gated: [dgate | dup]); dout with out's shape. A plain
// activation's dx may alias dout.
void activation_bwd(ActivationId kind, const Tensor& dx, const Tensor& dout,
                    const Tensor& x);

// ---- bias, residual, scale ----------------------------------------------------------------------
void bias_add(const Tensor& x, const Tensor& bias);         // x [n, m] += bias [m] (in place)
void bias_grad(const Tensor& dbias, const Tensor& dout);    // dbias [m] += sum_rows dout [n, m]
void add(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias)
void scale(const Tensor& x, float s);                         // x *= s (in place)
// out = tanh(x) (BERT's pooler; same numel, out may alias x); dx = dout * (1 - out^2) from the
// forward's output (dx may alias dout).
void tanh_fwd(const Tensor& out, const Tensor& x);
void tanh_bwd(const Tensor& dx, const Tensor& dout, const Tensor& out);

// ---- rows and flat buffers ----------------------------------------------------------------------
// Row gather / scatter for any dtype (KV-cache reorder in beam search, context-parallel packing,
// per-head work). index int32 [k] (contiguous). in and out are 2-D with unit inner stride (a row
// stride is allowed on both, so column blocks of a wider matrix work) and the same dtype and
// width. An index outside the indexed tensor's rows throws naming its position and value.
// out [k, w] row i = in row index[i]; in [n, w]. out must not overlap in.
void index_select_rows(const Tensor& out, const Tensor& in, const Tensor& index);
// out [n, w] row index[i] = in row i (+= with accumulate: fp32 only, duplicates summed in index
// order; without it the indices must be distinct). in [k, w]; out must not overlap in.
void index_copy_rows(const Tensor& out, const Tensor& in, const Tensor& index,
                     bool accumulate = false);
// The elements of parts (contiguous, flat's dtype) laid end to end in flat (numel = the sum),
// in order: copy_to_flat fills flat from parts, copy_from_flat writes parts back from flat
// (coalesced collectives over many small tensors).
void copy_to_flat(const Tensor& flat, const std::vector<Tensor>& parts);
void copy_from_flat(const std::vector<Tensor>& parts, const Tensor& flat);

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

// ---- core attention -----------------------------------------------------------------------------
// One op pair for every attention: queries (with their positions) against keys and values (with
// theirs), under a mask description, with an optional additive bias. Self-attention, cross-
// attention, context parallelism (a rank's queries against gathered keys, or against one ring
// block at a time), and the KV cache at inference are ways of preparing its operands.
//
// Geometry (AttentionShape): `batch` query sequences of `seq` rows each, every one against a
// key/value sequence of `kv_seq` rows (the batch row's own, or the one kv_index names); `heads`
// query heads in `groups` query groups (GQA; groups == heads is multi-head, 1 multi-query), query
// head h reading key/value head h / (heads / groups); head_dim d for queries, keys and values.
// Query row i of batch row b has position qpos(b, i), key row j position kpos(j) (defaults: i and
// j). Query (b, i) at position p attends key j at position k iff all of these hold:
//   start(b, i) <= k                      mask.attention_start [batch, seq] (--reset-attention-mask)
//   k <= p                                mask.causal
//   k >= p - window_left                  mask.window_left >= 0 (sliding window)
//   k <= p + window_right                 !mask.causal and mask.window_right >= 0
//   key_padding(kv sequence, k) != 0      mask.key_padding [kv sequences, kv_span]
// The score is softmax_scale * q.k + bias(b, h, p, k) + ALiBi slope(global h) * (k - p) (with
// mask.alibi). A query row that sees no key gets zeros, lse = -inf and no gradient.
// Positions index the whole attention: the dropout mask, the bias and the key padding are those of
// a [q_span, kv_span] attention (default [seq, kv_seq]), so a rank computing some of its rows, or
// its queries against one block of keys, uses the same masks as one run over everything. Dropout
// masks are indexed by the global head as well (tensor parallelism): element
//   element_offset + ((b * total_heads + head_offset + h) * q_span + p) * kv_span + k
// of the dropout stream.
struct AttentionShape {
  int64_t batch = 0, seq = 0;
  int heads = 0, groups = 0, head_dim = 0;
  float softmax_scale = 0.0f;  // usually 1/sqrt(head_dim)
  // Tensor parallelism: these `heads` are heads [head_offset, head_offset + heads) of a layer with
  // total_heads heads (0 = heads): dropout masks and ALiBi slopes follow the global head.
  int head_offset = 0, total_heads = 0;
  int64_t kv_seq = 0;  // key/value rows per sequence; 0 = seq
  // The extents the positions index (0: seq and kv_seq); see above.
  int64_t q_span = 0, kv_span = 0;
};

// Where the heads of one operand lie in its buffer, so that fused activations are read and written
// in place: element e of head h (0 <= h < the operand's heads) of row i of sequence s is at
//   offset + s * seq_stride + i * row_stride + (h / heads_per_group) * group_stride
//          + (h % heads_per_group) * head_dim + e
// elements from the start of the (contiguous fp32) tensor.
enum class QkvPart { Query, Key, Value };
struct HeadLayout {
  int64_t offset = 0, seq_stride = 0, row_stride = 0, group_stride = 0;
  int heads_per_group = 1;
  // Megatron-Core's fused QKV (linear_qkv's output) [sequences * seq, groups * (heads/groups + 2)
  // * head_dim]: per query group its heads/groups query heads, then its key head, then its value.
  static HeadLayout qkv(QkvPart part, int heads, int groups, int64_t head_dim, int64_t seq);
  // Fused keys and values [sequences * seq, groups * 2 * head_dim], per group its key head then its
  // value head (Megatron-Core's linear_kv output of cross-attention; context parallelism's blocks).
  static HeadLayout kv(QkvPart part, int groups, int64_t head_dim, int64_t seq);
  // Plain heads [sequences * seq, heads * head_dim] (a separate query projection; the output).
  static HeadLayout heads(int heads, int64_t head_dim, int64_t seq);
  // A KV cache [slots, groups, max_len, head_dim]: sequence = slot, row = position.
  static HeadLayout cache(int groups, int64_t max_len, int64_t head_dim);
};

// The mask description (see the section comment). The tensors are int32 and contiguous.
struct AttentionMask {
  bool causal = true;  // false: bidirectional (encoders, cross-attention)
  int64_t window_left = -1;   // -1: no limit
  int64_t window_right = -1;  // bidirectional only (-1: no limit); 0 is what causal means
  bool alibi = false;
  Tensor attention_start = {};  // [batch, seq]: first key position each query row sees, or undefined
  Tensor key_padding = {};      // [kv sequences, kv_span]: 0 marks a padding key, or undefined
  template <class F>
  void for_each_tensor(F&& f) const {
    f(attention_start);
    f(key_padding);
  }
};

// The operands: q, k, v fp32 contiguous buffers read through their layouts (they may be one
// tensor, e.g. fused QKV), and the optional positions, key/value sequence map and bias.
struct AttentionInputs {
  Tensor q = {}, k = {}, v = {};
  HeadLayout q_layout = {}, k_layout = {}, v_layout = {};
  Tensor q_positions = {};   // int32 [seq] (every batch row) or [batch, seq], >= 0; undefined: i
  Tensor kv_positions = {};  // int32 [kv_seq], strictly ascending, >= 0; undefined: j
  // int32 [batch]: the key/value sequence each batch row attends (KV-cache slots); undefined: its
  // own (b). Forward only.
  Tensor kv_index = {};
  Tensor bias = {};  // fp32 [1 or batch, heads, q_span, kv_span] added to the scores, or undefined
  template <class F>
  void for_each_tensor(F&& f) const {
    for (const Tensor* t : {&q, &k, &v, &q_positions, &kv_positions, &kv_index, &bias}) f(*t);
  }
};

// Gradients of the inputs: dq, dk, dv in the layouts of q, k, v (they may be one tensor), dbias
// with the bias's shape (undefined: not wanted).
struct AttentionGrads {
  Tensor dq = {}, dk = {}, dv = {}, dbias = {};
  template <class F>
  void for_each_tensor(F&& f) const {
    for (const Tensor* t : {&dq, &dk, &dv, &dbias}) f(*t);
  }
};

// ALiBi slopes of a layer with total_heads heads (Press et al., as BLOOM and Megatron-DeepSpeed
// build them): for a power of two n, 2^(-8 (h + 1) / n); otherwise those of the largest power of
// two p < n followed by every other slope of 2p (the first n - p of its even positions).
std::vector<float> alibi_slopes(int total_heads);  // a host helper (not dispatched)

// out [batch * seq, heads * d] (head-major columns) = softmax(scores) V with dropout on the
// probabilities. lse [batch, heads, seq] (row log-sum-exp of the scores) is written when defined
// (backward and the merge of partial results need it). probs [batch, heads, seq, kv_seq] receives
// the pre-dropout probabilities (exact zeros where masked) when defined, for backward; leave it
// undefined to recompute them there (selective recompute).
void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& probs,
                   const AttentionInputs& in, const AttentionMask& mask,
                   const AttentionShape& shape, const DropoutSpec& dropout);
// Gradients from dout and the forward's out, lse and probs (probs undefined: recomputed). Without
// `accumulate`, dq is written at every query row and dk, dv at every key row of every sequence
// (zeros where nothing flows) and dbias everywhere; with it, all of them are added to (a ring of
// key/value blocks, whose out and lse are the final merged ones). in.kv_index must be undefined.
void attention_bwd(const AttentionGrads& grads, const Tensor& dout, const Tensor& out,
                   const Tensor& lse, const Tensor& probs, const AttentionInputs& in,
                   const AttentionMask& mask, const AttentionShape& shape,
                   const DropoutSpec& dropout, bool accumulate = false);
// Online-softmax merge of a partial result (out_b [batch * seq, heads * d], lse_b [batch, heads,
// seq]: the same queries against other keys) into the running (out, lse): lse <- log(e^lse +
// e^lse_b), out <- out e^(lse_old - lse) + out_b e^(lse_b - lse).
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                     const Tensor& lse_b, const AttentionShape& shape);

// ---- rotary position embedding (RoPE) -----------------------------------------------------------
// Megatron-Core's RotaryEmbedding + apply_rotary_pos_emb on the fused QKV activation
// (HeadLayout::qkv): every query and key head is rotated in place, value heads are untouched, dims
// >= rotary_dim of a head pass through. For frequency i < rotary_dim/2 (inv_freq_i =
// base^(-2i/rotary_dim), angle = position * inv_freq_i, computed in double and rounded) the pair
// (a, b) = (x[i], x[i + rotary_dim/2]) (interleaved: (x[2i], x[2i+1])) becomes
// (a cos - b sin, b cos + a sin).
struct RotaryConfig {
  int rotary_dim = 0;     // dims rotated per head (even, <= head_dim): head_dim * --rotary-percent
  double base = 10000.0;  // --rotary-base
  // --rotary-interleaved: pairs (2i, 2i+1) share frequency i; else halves (i, i + rotary_dim/2).
  bool interleaved = false;
};
// qkv [N, g*(n/g+2)*d] (any leading shape with N rows), shape.heads / groups / head_dim this
// rank's; positions int32 [N]: the sequence position of each row's token (whole-sequence
// positions under context parallelism, cache positions at inference), >= 0.
void rope_fwd(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape,
              const RotaryConfig& rope);
// Backward in place on dqkv: the transposed rotation (by -angle).
void rope_bwd(const Tensor& dqkv, const Tensor& positions, const AttentionShape& shape,
              const RotaryConfig& rope);

// ---- KV cache (inference) -----------------------------------------------------------------------
// k_cache, v_cache [slots, groups, max_len, d] (HeadLayout::cache; groups, d: shape.groups,
// shape.head_dim), fp32, or bf16 on the CPU (with bf16 qkv: the bf16 kernel reads it). Row r of qkv [n, width] (fused QKV as HeadLayout::qkv, rotary already applied)
// belongs to cache slot row_slot[r] at sequence position row_pos[r] (int32 [n] each, slot in
// [0, slots), position in [0, max_len)): its key and value heads are written there. Attention of
// the rows against their slots is attention_fwd with the cache as keys and values and row_slot as
// kv_index (model/attention.cpp).
void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos, const AttentionShape& shape);

// ---- softmax cross-entropy over the vocab -------------------------------------------------------
// logits [n, V] fp32 (row-strided allowed), labels int32 [n], loss_mask fp32 [n] or undefined
// (all ones). Writes loss [n] (per-token, unmasked) and, when grad_scale_or_zero != 0, replaces
// logits in place by d(grad_scale * sum(loss * mask))/dlogits. A label outside [0, V) throws.
void softmax_xent_fwd_bwd(const Tensor& logits, const Tensor& loss, const Tensor& labels,
                          const Tensor& loss_mask, float grad_scale, bool write_grad);

// ---- vocab-parallel cross entropy: the per-row work of Megatron's _VocabParallelCrossEntropy ----
// logits [n, Vl] fp32 contiguous: this rank's vocabulary ids [vocab_start, vocab_start + Vl) of
// vocab_size. targets [n] int32 or int64 (global ids). The caller all-reduces between the steps.
// 1. logits_max [n] = row max of logits. A target outside [0, vocab_size) throws Error naming
//    the token (before any collective, so every rank of the group throws alike).
void vocab_parallel_xent_max(const Tensor& logits_max, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_size);
// 2. With logits_max all-reduced (MAX): logits <- exp(logits - max) in place; stats [3, n]
//    written: row 0 the target's shifted logit (0 where another rank owns the target), row 1 the
//    sum of exp, row 2 the sum of shifted logits (for label smoothing); local_target int64 [n]:
//    target - vocab_start, or -1 when another rank owns it.
void vocab_parallel_xent_partials(const Tensor& stats, const Tensor& local_target,
                                  const Tensor& logits, const Tensor& logits_max,
                                  const Tensor& targets, int64_t vocab_start);
// 3. With stats all-reduced (SUM): loss [n] = log Z - z_t, with label smoothing a = ls V/(V-1):
//    (1 - a)(log Z - z_t) - a * mean log-probability over the whole vocabulary; exp_logits /= Z
//    in place (the softmax, saved for backward).
void vocab_parallel_xent_loss(const Tensor& loss, const Tensor& exp_logits, const Tensor& stats,
                              int64_t vocab_size, float label_smoothing);
// dlogits [n, Vl] = (softmax - a/V - (1 - a) onehot(local_target)) * dloss[row]; dloss [n] fp32.
void vocab_parallel_xent_bwd(const Tensor& dlogits, const Tensor& softmax,
                             const Tensor& local_target, const Tensor& dloss, int64_t vocab_size,
                             float label_smoothing);

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
// SGD with coupled weight decay and momentum (torch.optim.SGD): g' = g + wd p; buf = g' on the
// first step or without momentum, else momentum buf + g'; p -= lr buf. param, grad, momentum_buf
// fp32 of the same numel (momentum_buf is written even without momentum).
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
              float weight_decay, float momentum, bool first_step);

// ---- reductions and casts -----------------------------------------------------------------------
// Sums in double over any float dtype (fp32, fp64, bf16, fp16; contiguous), in fixed blocks
// summed in order, so the result does not depend on the thread count. dot: same numel, the two
// dtypes may differ (masked loss sums, token counts). l2_norm_squared: the sum of squares (finite
// exactly when every element is: a float's square is far inside double's range).
double l2_norm_squared(const Tensor& x);
// l2_norm_squared of each tensor, in order, read back from the device once for all of them (the
// optimizer's gradient norm and finite check: one host synchronisation a step, not one per
// parameter). On the CPU exactly the values of l2_norm_squared one by one.
std::vector<double> l2_norm_squared_each(const std::vector<Tensor>& xs);
double sum(const Tensor& x);
double dot(const Tensor& a, const Tensor& b);
bool all_finite(const Tensor& x);          // false if any NaN/Inf (any float dtype)
// The smallest and largest value of a contiguous int32 tensor (token and position ids are
// range-checked with it); {INT64_MAX, INT64_MIN} when empty.
struct IntRange {
  int64_t min, max;
};
IntRange int_range(const Tensor& ids);
void cast(const Tensor& dst, const Tensor& src);  // fp32/bf16/fp16/f64 <-> any (RNE), same numel

}  // namespace megatron::ops
