// The core attention op on the GPU, forward and merge (attention_common.cuh describes the plan and
// the kernels; the backward is in attention_bwd.cu). One warp per query row: the row's query in
// shared memory, its output in registers (DT chunks of 32 elements per lane), keys of its visible
// range in chunks of 32 (lane t scores key c0 + t), an online softmax (running maximum and sum,
// the output rescaled when the maximum grows), dropout on the probabilities before P V.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace megatron::cuda {

namespace attn {

namespace {

void check_ints(const char* op, const char* name, const Tensor& t, int64_t numel,
                const char* shape) {
  detail::require_cuda(op, name, t);
  MG_CHECK(t.dtype() == DType::I32 && t.numel() == numel, op, ": ", name,
           " must be contiguous int32 ", shape, " (", numel, " elements), got ",
           dtype_name(t.dtype()), " ", shape_str(t.shape()));
}

Layout operand(const char* op, const char* name, const Tensor& t, const ops::HeadLayout& L,
               int64_t seqs, int64_t rows, int heads, int64_t d, bool half = false) {
  if (half) {
    detail::require_cuda(op, name, t);
    MG_CHECK(t.dtype() == DType::BF16, op, ": ", name, " must be bf16 like q, got ",
             dtype_name(t.dtype()));
  } else {
    detail::require_f32(op, name, t);
  }
  ops::check_head_operand(op, name, t, L, seqs, rows, heads, d);
  return Layout{L.offset, L.seq_stride, L.row_stride, L.group_stride, L.heads_per_group};
}

}  // namespace

void require_numel(const char* op, const char* name, const Tensor& t, int64_t numel) {
  detail::require_f32(op, name, t);
  MG_CHECK(t.numel() == numel, op, ": ", name, " ", shape_str(t.shape()), " must have ", numel,
           " elements");
}

float* grad_operand(const char* op, const char* name, const Tensor& t, const ops::HeadLayout& L,
                    int64_t seqs, int64_t rows, int heads, int64_t d) {
  operand(op, name, t, L, seqs, rows, heads, d);
  return t.data<float>();
}

bool half_operands(const char* op, const ops::AttentionInputs& in) {
  for (const Tensor* t : {&in.q, &in.k, &in.v}) detail::require_cuda(op, "q, k and v", *t);
  const DType dt = in.q.dtype();
  MG_CHECK((dt == DType::F32 || dt == DType::BF16) && in.k.dtype() == dt && in.v.dtype() == dt,
           op, ": q, k and v must all be fp32 or all bf16, got ", dtype_name(dt), ", ",
           dtype_name(in.k.dtype()), ", ", dtype_name(in.v.dtype()));
  return dt == DType::BF16;
}

ops::AttentionInputs with_f32_operands(const ops::AttentionInputs& in) {
  ops::AttentionInputs f = in;
  const auto f32 = [](const Tensor& t) {
    Tensor c = Tensor::empty(t.shape(), DType::F32, t.device());
    megatron::cuda::cast(c, t);
    return c;
  };
  const auto same = [](const Tensor& a, const Tensor& b) {
    return a.raw_data() == b.raw_data() && a.shape() == b.shape();
  };
  f.q = f32(in.q);
  f.k = same(in.k, in.q) ? f.q : f32(in.k);
  f.v = same(in.v, in.q) ? f.q : same(in.v, in.k) ? f.k : f32(in.v);
  return f;
}

Plan make_plan(const char* op, const ops::AttentionInputs& in, const ops::AttentionMask& mask,
               const ops::AttentionShape& sh, const ops::DropoutSpec& dropout, Tensor& slopes,
               bool half) {
  Plan P;
  static_cast<ops::AttentionDims&>(P) = ops::attention_dims(op, mask, sh);
  MG_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, op, ": dropout probability ", dropout.p,
           " outside [0, 1)");
  P.drop_p = dropout.p;
  P.seed = dropout.seed;
  P.stream = dropout.stream;
  P.element_offset = dropout.element_offset;
  if (!half) detail::require_f32(op, "q", in.q);
  const Device dev = in.q.device();
  if (mask.alibi) {
    const std::vector<float> all = ops::alibi_slopes(P.total_heads);
    slopes = Tensor::empty({P.n}, DType::F32, dev);
    // A pageable source: the call returns once the bytes are staged, so `all` may go.
    MG_CUDA_CHECK(cudaMemcpyAsync(slopes.data<float>(), all.data() + P.head_offset,
                                  size_t(P.n) * sizeof(float), cudaMemcpyHostToDevice,
                                  detail::stream()));
    P.slopes = slopes.data<float>();
  }
  P.kv_seqs = P.b;
  if (in.kv_index.defined()) {
    check_ints(op, "kv_index", in.kv_index, P.b, "[batch]");
    P.kv_index = in.kv_index.data<int32_t>();
    // The sequences the cache holds: as many as its layout's tensor has room for.
    const ops::HeadLayout& L = in.k_layout;
    const int64_t one = ops::head_layout_extent(L, 1, P.skv, P.g, P.d);
    MG_CHECK(L.seq_stride > 0 || P.b <= 1, op, ": a KV cache read through kv_index needs a "
             "sequence stride in k's layout");
    P.kv_seqs = L.seq_stride > 0 && in.k.numel() >= one
                    ? (in.k.numel() - one) / L.seq_stride + 1
                    : 1;
  }
  P.ql = operand(op, "q", in.q, in.q_layout, P.b, P.sq, P.n, P.d, half);
  P.kl = operand(op, "k", in.k, in.k_layout, P.kv_seqs, P.skv, P.g, P.d, half);
  P.vl = operand(op, "v", in.v, in.v_layout, P.kv_seqs, P.skv, P.g, P.d, half);
  if (half) {
    P.qh = static_cast<const __nv_bfloat16*>(in.q.raw_data());
    P.kh = static_cast<const __nv_bfloat16*>(in.k.raw_data());
    P.vh = static_cast<const __nv_bfloat16*>(in.v.raw_data());
  } else {
    P.q = in.q.data<float>();
    P.k = in.k.data<float>();
    P.v = in.v.data<float>();
  }
  if (in.q_positions.defined()) {
    P.qpos_per_row = in.q_positions.numel() != P.sq || P.b == 1;
    check_ints(op, "q_positions", in.q_positions, P.qpos_per_row ? P.b * P.sq : P.sq,
               "[seq] or [batch, seq]");
    P.qpos = in.q_positions.data<int32_t>();
  } else {
    MG_CHECK(P.sq <= P.q_span, op, ": ", P.sq, " query rows exceed q_span ", P.q_span);
  }
  if (in.kv_positions.defined()) {
    check_ints(op, "kv_positions", in.kv_positions, P.skv, "[kv_seq]");
    P.kpos = in.kv_positions.data<int32_t>();
  } else {
    MG_CHECK(P.skv <= P.kv_span, op, ": ", P.skv, " key rows exceed kv_span ", P.kv_span);
  }
  if (mask.attention_start.defined()) {
    check_ints(op, "attention_start", mask.attention_start, P.b * P.sq, "[batch, seq]");
    P.start = mask.attention_start.data<int32_t>();
  }
  if (mask.key_padding.defined()) {
    const Tensor& kp = mask.key_padding;
    detail::require_cuda(op, "key_padding", kp);
    MG_CHECK(kp.dtype() == DType::I32 && kp.numel() % P.kv_span == 0 &&
                 (in.kv_index.defined() || kp.numel() / P.kv_span >= P.b),
             op, ": key_padding must be contiguous int32 [kv sequences, kv_span (", P.kv_span,
             ")], got ", shape_str(kp.shape()));
    P.pad = kp.data<int32_t>();
    P.pad_seqs = kp.numel() / P.kv_span;
  }
  if (in.bias.defined()) {
    detail::require_f32(op, "bias", in.bias);
    P.bias_batch = ops::attention_bias_batch(op, in.bias, P);
    P.bias = in.bias.data<float>();
  }
  return P;
}

namespace {

// A block holds kWarps * R consecutive query rows of one (bi, h) (R rows per warp, RowsPerWarp),
// and walks the union of their visible key ranges in chunks of 32 keys: each chunk's K and V rows
// are staged once in shared memory (K with a padded pitch, so that lane t reading key t's element
// e hits its own bank) and used by every row of the block. Per row the math is the row kernel's:
// lane t scores key c0 + t, an online softmax over the chunks, then P V with each probability
// broadcast from its lane. Dynamic shared memory: ks [32][d + 1], vs [32][d], qs [kWarps][R][d].
template <int DT>
__global__ void __launch_bounds__(kWarps * 32)
    fwd_kernel(Plan P, float* out, float* lse, float* probs, int64_t tiles) {
  constexpr int R = RowsPerWarp<DT>::value;
  extern __shared__ float smem[];
  __shared__ int64_t warp_lo[kWarps], warp_hi[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, d = P.d;
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * (kWarps * R) + warp * R;
  const int64_t bi = bh / P.n;
  const int h = int(bh % P.n), grp = h / P.hpg;
  const int64_t kvs = P.kv_seq_of(bi);
  float* ks = smem;
  float* vs = ks + 32 * (d + 1);
  float* qs = vs + 32 * d + int64_t(warp) * R * d;
  int64_t lo[R], hi[R], pos[R];
  int64_t wlo = INT64_MAX, whi = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    lo[r] = hi[r] = pos[r] = 0;
    if (i < P.sq) {
      P.key_range(bi, i, lo[r], hi[r]);
      pos[r] = P.q_position(bi, i);
      const float* qr = P.q + P.ql.at(bi, i, h, d);
      for (int e = lane; e < d; e += 32) qs[r * d + e] = qr[e];
      if (hi[r] > lo[r]) {
        wlo = min(wlo, lo[r]);
        whi = max(whi, hi[r]);
      }
    }
  }
  int64_t blo, bhi;
  block_key_range(wlo, whi, warp_lo, warp_hi, blo, bhi);
  float m[R], l[R], acc[R][DT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < DT; ++t) acc[r][t] = 0.0f;
  }
  for (int64_t c0 = blo; c0 < bhi; c0 += 32) {
    const int count = int(min(int64_t(32), bhi - c0));
    __syncthreads();  // the previous chunk is done with
    for (int64_t x = threadIdx.x; x < int64_t(count) * d; x += blockDim.x) {
      const int jj = int(x / d), e = int(x - int64_t(jj) * d);
      ks[jj * (d + 1) + e] = P.k[P.kl.at(kvs, c0 + jj, grp, d) + e];
      vs[jj * d + e] = P.v[P.vl.at(kvs, c0 + jj, grp, d) + e];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (c0 >= hi[r] || c0 + 32 <= lo[r]) continue;  // warp-uniform: the row sees none of it
      const int64_t j = c0 + lane;
      float s = -INFINITY;
      if (lane < count && j >= lo[r] && j < hi[r] && P.key_usable(kvs, j)) {
        const float* kj = ks + lane * (d + 1);
        const float* q = qs + r * d;
        float qk = 0.0f;
        for (int e = 0; e < d; ++e) qk += q[e] * kj[e];
        s = P.score(qk, bi, h, pos[r], j);
      }
      const float cmax = warp_max(s);
      if (cmax == -INFINITY) continue;  // nothing visible in this chunk
      const float m_new = fmaxf(m[r], cmax);
      const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
      const float ex = s == -INFINITY ? 0.0f : expf(s - m_new);
      l[r] = l[r] * alpha + warp_sum(ex);
#pragma unroll
      for (int t = 0; t < DT; ++t) acc[r][t] *= alpha;
      m[r] = m_new;
      const float pe = ex != 0.0f ? ex * P.keep(bi, h, pos[r], j) : 0.0f;
      for (int jj = 0; jj < count; ++jj) {
        const float pj = __shfl_sync(kFull, pe, jj);
        if (pj == 0.0f) continue;  // the same for every lane
        const float* vr = vs + jj * d;
#pragma unroll
        for (int t = 0; t < DT; ++t)
          if (lane + 32 * t < d) acc[r][t] += pj * vr[lane + 32 * t];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    if (i >= P.sq) continue;
    const int64_t row = bh * P.sq + i;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* o = out + (bi * P.sq + i) * (int64_t(P.n) * d) + int64_t(h) * d;
#pragma unroll
    for (int t = 0; t < DT; ++t)
      if (lane + 32 * t < d) o[lane + 32 * t] = acc[r][t] * inv;
    if (lse && lane == 0) lse[row] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    if (probs) {  // the pre-dropout probabilities, exact zeros where masked
      float* pr = probs + row * P.skv;
      for (int64_t j = lane; j < P.skv; j += 32) {
        float v = 0.0f;
        if (l[r] > 0.0f && j >= lo[r] && j < hi[r] && P.key_usable(kvs, j)) {
          const float s =
              P.score(row_dot(qs + r * d, P.k + P.kl.at(kvs, j, grp, d), d), bi, h, pos[r], j);
          v = expf(s - m[r]) * inv;
        }
        pr[j] = v;
      }
    }
  }
}

// One thread per (bi, h, i) row: the CPU's merge formula.
__global__ void merge_kernel(float* o, float* l, const float* ob, const float* lb, int64_t rows,
                             int64_t sq, int n, int64_t d) {
  MG_GRID_STRIDE(r, rows) {
    const float a = l[r], c = lb[r];
    if (c == -INFINITY) continue;  // the partial result adds nothing
    float wa = 0.0f, wb = 1.0f, mm = c;
    if (a != -INFINITY) {
      const float mx = fmaxf(a, c);
      mm = mx + logf(expf(a - mx) + expf(c - mx));
      wa = expf(a - mm);
      wb = expf(c - mm);
    }
    l[r] = mm;
    const int64_t bi = r / (sq * n), h = (r / sq) % n, i = r % sq;
    const int64_t at = (bi * sq + i) * (n * d) + h * d;
    for (int64_t k = 0; k < d; ++k) o[at + k] = wa * o[at + k] + wb * ob[at + k];
  }
}

}  // namespace

}  // namespace attn

void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& probs,
                   const ops::AttentionInputs& in, const ops::AttentionMask& mask,
                   const ops::AttentionShape& shape, const ops::DropoutSpec& dropout) {
  const char* op = "attention_fwd";
  Tensor slopes;
  if (attn::half_operands(op, in)) {  // bf16: the tensor cores where the call fits them
    if (!probs.defined()) {
      const attn::Plan H = attn::make_plan(op, in, mask, shape, dropout, slopes, true);
      if (attn::tc_eligible(H)) {
        attn::require_numel(op, "out", out, H.b * H.sq * int64_t(H.n) * H.d);
        if (lse.defined()) attn::require_numel(op, "lse", lse, H.b * H.n * H.sq);
        attn::tc_fwd(op, H, out.data<float>(), lse.defined() ? lse.data<float>() : nullptr);
        return;
      }
    }
    return cuda::attention_fwd(out, lse, probs, attn::with_f32_operands(in), mask, shape, dropout);
  }
  const attn::Plan P = attn::make_plan(op, in, mask, shape, dropout, slopes);
  attn::require_numel(op, "out", out, P.b * P.sq * int64_t(P.n) * P.d);
  if (lse.defined()) attn::require_numel(op, "lse", lse, P.b * P.n * P.sq);
  if (probs.defined()) attn::require_numel(op, "probs", probs, P.b * P.n * P.sq * P.skv);
  const int64_t rows = P.b * P.n * P.sq;
  if (rows == 0) return;
  attn::with_head_chunks(op, P.d, [&]<int DT>(std::integral_constant<int, DT>) {
    const int64_t per_block = attn::kWarps * attn::RowsPerWarp<DT>::value;
    const int64_t tiles = (P.sq + per_block - 1) / per_block;
    const size_t bytes =
        size_t(32 * (P.d + 1) + 32 * P.d + per_block * P.d) * sizeof(float);
    const auto kernel = attn::fwd_kernel<DT>;
    attn::allow_shared(op, kernel, bytes);
    kernel<<<attn::block_count(op, P.b * P.n * tiles), attn::kWarps * 32, bytes,
             detail::stream()>>>(P, out.data<float>(),
                                 lse.defined() ? lse.data<float>() : nullptr,
                                 probs.defined() ? probs.data<float>() : nullptr, tiles);
  });
  MG_CUDA_LAUNCH_CHECK();
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                     const Tensor& lse_b, const ops::AttentionShape& sh) {
  const char* op = "attention_merge";
  const int64_t rows = sh.batch * sh.heads * sh.seq, w = int64_t(sh.heads) * sh.head_dim;
  attn::require_numel(op, "out", out, sh.batch * sh.seq * w);
  attn::require_numel(op, "out_b", out_b, sh.batch * sh.seq * w);
  attn::require_numel(op, "lse", lse, rows);
  attn::require_numel(op, "lse_b", lse_b, rows);
  if (rows == 0) return;
  attn::merge_kernel<<<detail::grid_for(rows, 256), 256, 0, detail::stream()>>>(
      out.data<float>(), lse.data<float>(), out_b.data<float>(), lse_b.data<float>(), rows,
      sh.seq, sh.heads, sh.head_dim);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
