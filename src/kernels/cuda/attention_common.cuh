// The core attention op on the GPU (ops::attention_fwd / attention_bwd / attention_merge): the
// call checked once on the host and turned into a plan of raw device pointers and strides, and the
// per-row helpers its kernels share (positions, the visible key range, key padding, the bias and
// ALiBi terms, the dropout keep factor: the CPU's Philox element, so masks match the CPU's).
// attention.cu holds the forward and the merge, attention_bwd.cu the backward.
//
// The kernels are flash-style with fp32 accumulation: one warp per query row (forward, dQ) or per
// key row (dK, dV); the keys (or queries) are walked in chunks of 32, one per lane, with an online
// softmax, and the probabilities are never stored unless the caller asks for them. Head dims up to
// kMaxHeadDim (the row being worked on lives in shared memory, its accumulators in registers).
//
// Positions, kv_index and the masks come from the model and the inference engine, not from user
// data: like the KV-cache append they are not read back to the host for checks (that would stall
// the stream once per layer); a query row at a position outside its span, or reading a key/value
// sequence below 0, sees no key, and keys at positions outside their span are never visible.
#pragma once

#include <cmath>
#include <type_traits>

#include "core/rng.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/attention_args.h"
#include "kernels/ops.h"

namespace megatron::cuda::attn {

inline constexpr int kWarps = 4;  // warps per block
inline constexpr int kMaxHeadDim = 256;
inline constexpr unsigned kFull = 0xffffffffu;

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// ops::HeadLayout on the device.
struct Layout {
  int64_t offset = 0, seq_stride = 0, row_stride = 0, group_stride = 0;
  int heads_per_group = 1;
  __host__ __device__ int64_t at(int64_t seq, int64_t row, int head, int64_t d) const {
    return offset + seq * seq_stride + row * row_stride +
           int64_t(head / heads_per_group) * group_stride + int64_t(head % heads_per_group) * d;
  }
};

struct Plan : ops::AttentionDims {
  const float* slopes = nullptr;  // [n] ALiBi slopes of the local heads, or null
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  // bf16 operands (the tensor-core kernels of attention_tc.cu), instead of q, k and v.
  const __nv_bfloat16 *qh = nullptr, *kh = nullptr, *vh = nullptr;
  Layout ql, kl, vl;
  const int32_t* qpos = nullptr;  // [sq] or [b, sq] (qpos_per_row), or null: i
  bool qpos_per_row = false;
  const int32_t* kpos = nullptr;      // [skv] ascending, or null: j
  const int32_t* kv_index = nullptr;  // [b], or null: b
  int64_t kv_seqs = 0;                // key/value sequences the operands hold
  const int32_t* start = nullptr;     // [b, sq]
  const int32_t* pad = nullptr;       // [pad_seqs, kv_span]
  int64_t pad_seqs = 0;
  const float* bias = nullptr;        // [bias_batch, n, q_span, kv_span]
  int64_t bias_batch = 0;
  float drop_p = 0.0f;                // dropout on the probabilities (0: none)
  uint64_t seed = 0, stream = 0, element_offset = 0;

  __device__ int64_t q_position(int64_t bi, int64_t i) const {
    return qpos ? qpos[qpos_per_row ? bi * sq + i : i] : i;
  }
  __device__ int64_t k_position(int64_t j) const { return kpos ? kpos[j] : j; }
  // The key/value sequence batch row bi reads, or -1 when kv_index names none the operands hold.
  __device__ int64_t kv_seq_of(int64_t bi) const {
    if (!kv_index) return bi;
    const int64_t s = kv_index[bi];
    return s >= 0 && s < kv_seqs ? s : -1;
  }
  // Key rows [lo, hi) query row i of batch row bi may see, before key padding (the CPU's
  // key_range; binary searches over the ascending key positions).
  __device__ void key_range(int64_t bi, int64_t i, int64_t& lo, int64_t& hi) const {
    const int64_t p = q_position(bi, i);
    lo = hi = 0;
    if (p < 0 || p >= q_span || kv_seq_of(bi) < 0) return;
    int64_t first = start ? start[bi * sq + i] : 0;
    if (window_left >= 0) first = max(first, p - window_left);
    const bool bounded = causal || window_right >= 0;
    const int64_t last = causal ? p : p + window_right;  // inclusive, when bounded
    if (kpos) {
      lo = lower_bound(first);
      hi = bounded ? lower_bound(last + 1) : skv;
    } else {
      lo = min(max(first, int64_t(0)), skv);
      hi = bounded ? min(max(last + 1, int64_t(0)), skv) : skv;
    }
    if (hi < lo) hi = lo;
  }
  // The first key row whose position is >= x.
  __device__ int64_t lower_bound(int64_t x) const {
    int64_t a = 0, c = skv;
    while (a < c) {
      const int64_t mid = (a + c) / 2;
      if (kpos[mid] < x) a = mid + 1; else c = mid;
    }
    return a;
  }
  // Key row j of kv sequence kvs is neither padding nor at a position outside its span.
  __device__ bool key_usable(int64_t kvs, int64_t j) const {
    const int64_t kp = k_position(j);
    if (kp < 0 || kp >= kv_span) return false;
    return !pad || (kvs < pad_seqs && pad[kvs * kv_span + kp] != 0);
  }
  // Index of (bi, local head h, query position p, key position kp) in the bias (and dbias).
  __device__ int64_t bias_index(int64_t bi, int h, int64_t p, int64_t kp) const {
    return ((int64_t(bias_batch == 1 ? 0 : bi) * n + h) * q_span + p) * kv_span + kp;
  }
  // What softmax sees for query (bi, h, at position p) and key row j, from q . k already formed.
  __device__ float score(float qk, int64_t bi, int h, int64_t p, int64_t j) const {
    float s = scale * qk;
    const int64_t kp = k_position(j);
    if (bias) s += bias[bias_index(bi, h, p, kp)];
    if (slopes) s += slopes[h] * float(kp - p);
    return s;
  }
  // The dropout factor (0 or 1/(1-p)) of (bi, h, p) and key row j: the CPU's Philox element.
  __device__ float keep(int64_t bi, int h, int64_t p, int64_t j) const {
    if (drop_p <= 0.0f) return 1.0f;
    const uint64_t e = element_offset +
                       uint64_t(((bi * total_heads + head_offset + h) * q_span + p) * kv_span) +
                       uint64_t(k_position(j));
    return philox_word_to_uniform(philox_u32(seed, stream, e)) >= drop_p
               ? 1.0f / (1.0f - drop_p)
               : 0.0f;
  }
};

// Query (or key) rows per warp in the tiled kernels: as many as keep a row's accumulators (DT
// registers per lane each) within a few dozen registers.
template <int DT>
struct RowsPerWarp {
  static constexpr int value = DT <= 2 ? 8 : 16 / DT;
};

// The union [blo, bhi) of the key ranges of a block's rows, from each warp's union [wlo, whi)
// (INT64_MAX, 0 when empty), through the block's shared warp_lo/warp_hi [kWarps]. Every thread of
// the block calls it (it synchronises the block).
__device__ inline void block_key_range(int64_t wlo, int64_t whi, int64_t* warp_lo,
                                       int64_t* warp_hi, int64_t& blo, int64_t& bhi) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    warp_lo[warp] = wlo;
    warp_hi[warp] = whi;
  }
  __syncthreads();
  blo = INT64_MAX;
  bhi = 0;
  for (int w = 0; w < kWarps; ++w) {
    blo = min(blo, warp_lo[w]);
    bhi = max(bhi, warp_hi[w]);
  }
}

// Raises a kernel's dynamic shared-memory limit to `bytes` (above the default 48 KB for wide
// heads); Error when the device cannot give that much.
template <class Kernel>
void allow_shared(const char* op, Kernel kernel, size_t bytes) {
  MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(bytes)));
  (void)op;
}

// A 1-D grid of `blocks` blocks (Error past CUDA's limit).
inline unsigned block_count(const char* op, int64_t blocks) {
  MG_CHECK(blocks < (int64_t(1) << 31), op, ": ", blocks, " blocks exceed a CUDA grid");
  return unsigned(blocks < 1 ? 1 : blocks);
}

// x . y over d elements, x in shared memory (every lane reads the same element: a broadcast).
__device__ inline float row_dot(const float* x, const float* y, int d) {
  float s = 0.0f;
  for (int e = 0; e < d; ++e) s += x[e] * y[e];
  return s;
}

// Checks the call as the CPU's plan does (CUDA fp32 operands, layouts inside their tensors, the
// shapes of positions, masks and bias) and fills the plan. `slopes` receives the ALiBi slopes'
// device tensor (kept alive by the caller until the launch is queued).
// With `half`, q, k and v are bf16 (qh, kh, vh filled instead of q, k, v).
Plan make_plan(const char* op, const ops::AttentionInputs& in, const ops::AttentionMask& mask,
               const ops::AttentionShape& shape, const ops::DropoutSpec& dropout, Tensor& slopes,
               bool half = false);
// An fp32 CUDA tensor of `numel` elements.
void require_numel(const char* op, const char* name, const Tensor& t, int64_t numel);
// A gradient operand with an input's layout, bounds checked like it; its data.
float* grad_operand(const char* op, const char* name, const Tensor& t, const ops::HeadLayout& L,
                    int64_t seqs, int64_t rows, int heads, int64_t d);
// The instantiation of a kernel for a head dim: fn(std::integral_constant<int, DT>) with DT the
// 32-element chunks per lane (1, 2, 4 or 8).
template <class Fn>
void with_head_chunks(const char* op, int d, Fn&& fn) {
  MG_CHECK(d <= kMaxHeadDim, op, ": head_dim ", d, " exceeds the CUDA kernel's ", kMaxHeadDim,
           "; use --device cpu or a smaller --kv-channels");
  if (d <= 32) return fn(std::integral_constant<int, 1>{});
  if (d <= 64) return fn(std::integral_constant<int, 2>{});
  if (d <= 128) return fn(std::integral_constant<int, 4>{});
  return fn(std::integral_constant<int, 8>{});
}

// delta [b, n, sq] = rowsum(dO * O) of out, dout [b * sq, n * d] (the backward's D; one warp a row).
void launch_delta(const Plan& P, const float* dout, const float* out, float* delta);

// ---- the tensor-core kernels (attention_tc.cu) ----
// Whether a plan of bf16 operands fits them: head dim 64 or 128, a causal or unlimited
// bidirectional mask with default positions, no padding, starts, bias, ALiBi, window or KV cache,
// 16-byte aligned operands whose layouts advance in multiples of 8 elements.
bool tc_eligible(const Plan& P);
// out [b * sq, n * d] and lse [b, n, sq] (or null) of an eligible plan.
void tc_fwd(const char* op, const Plan& P, float* out, float* lse);
// dq, dk, dv (fp32, in the layouts of q, k, v) of an eligible plan, written or accumulated.
void tc_bwd(const char* op, const Plan& P, float* dq, float* dk, float* dv, const Tensor& dout,
            const float* out, const float* lse, bool accumulate);
// Whether the call's q, k, v are bf16 (all of them: mixed dtypes are an error).
bool half_operands(const char* op, const ops::AttentionInputs& in);
// The call with fp32 copies of q, k and v (one copy for operands that are one tensor).
ops::AttentionInputs with_f32_operands(const ops::AttentionInputs& in);

}  // namespace megatron::cuda::attn
