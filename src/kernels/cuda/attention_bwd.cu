// The core attention op on the GPU, backward (attention_common.cuh describes the plan; the forward
// is in attention.cu). With P the probabilities (saved, or recomputed from the scores and the
// forward's log-sum-exp), keep the dropout factors, D = rowsum(dO * O):
//   dS = P (keep dO V^T - D),  dQ = scale dS K,  dK = scale dS^T Q,  dV = (P keep)^T dO,
// and dbias += dS at each (query position, key position). Three kernels: D per query row; dQ with
// one warp per query row (its keys in chunks of 32, one per lane; dbias added atomically); dK and
// dV with one warp per key row (the group's heads in turn, their query rows in chunks of 32). Every
// output row is written by exactly one warp, so no gradient of q, k or v needs atomics, and q, k
// and v may share one tensor (fused QKV).
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace megatron::cuda {

namespace attn {

namespace {

struct Grads {
  float *dq = nullptr, *dk = nullptr, *dv = nullptr, *dbias = nullptr;
  Layout dql, dkl, dvl;
  const float *dout = nullptr, *out = nullptr, *lse = nullptr, *probs = nullptr;
  float* delta = nullptr;  // [b, n, sq]: rowsum(dO * O)
  bool accumulate = false;
};

// One warp per query row (bi, h, i): D = dO . O.
__global__ void delta_kernel(Plan P, const float* dout, const float* out, float* delta) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarps) + warp;
  if (row >= P.b * P.n * P.sq) return;
  const int64_t i = row % P.sq, bi = row / (P.sq * P.n);
  const int h = int((row / P.sq) % P.n);
  const int64_t at = (bi * P.sq + i) * (int64_t(P.n) * P.d) + int64_t(h) * P.d;
  float s = 0.0f;
  for (int e = lane; e < P.d; e += 32) s += dout[at + e] * out[at + e];
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// P of query row (bi, h, i) at position p (log-sum-exp lse_i) and key row j, qk = q_i . k_j.
__device__ inline float prob(const Plan& P, const Grads& G, int64_t row, float qk, float lse_i,
                             int64_t bi, int h, int64_t p, int64_t j) {
  if (G.probs) return G.probs[row * P.skv + j];
  return expf(P.score(qk, bi, h, p, j) - lse_i);
}

// dQ (and dbias): a block holds kWarps * R consecutive query rows of one (bi, h), as the forward
// does, and walks the union of their key ranges in chunks of 32 keys staged in shared memory (K
// and V with padded pitches: lane t reads key t's row). Per row: lane t forms dS for key c0 + t,
// then dQ += dS_j K_j with each dS broadcast from its lane. Dynamic shared memory: ks, vs
// [32][d + 1], qs and dos [kWarps][R][d].
template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dq_kernel(Plan P, Grads G, int64_t tiles) {
  constexpr int R = RowsPerWarp<DT>::value;
  extern __shared__ float smem[];
  __shared__ int64_t warp_lo[kWarps], warp_hi[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, d = P.d;
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * (kWarps * R) + warp * R;
  const int64_t bi = bh / P.n;
  const int h = int(bh % P.n), grp = h / P.hpg;
  float* ks = smem;
  float* vs = ks + 32 * (d + 1);
  float* qs = vs + 32 * (d + 1) + int64_t(warp) * R * d;
  float* dos = qs + int64_t(kWarps) * R * d;
  int64_t lo[R], hi[R], pos[R];
  float lse_r[R], delta_r[R];
  int64_t wlo = INT64_MAX, whi = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    lo[r] = hi[r] = pos[r] = 0;
    lse_r[r] = -INFINITY;
    delta_r[r] = 0.0f;
    if (i < P.sq) {
      const int64_t row = bh * P.sq + i;
      lse_r[r] = G.lse[row];
      delta_r[r] = G.delta[row];
      P.key_range(bi, i, lo[r], hi[r]);
      if (lse_r[r] == -INFINITY) hi[r] = lo[r];  // the row saw no key: no gradient
      pos[r] = P.q_position(bi, i);
      const float* qr = P.q + P.ql.at(bi, i, h, d);
      const float* dor = G.dout + (bi * P.sq + i) * (int64_t(P.n) * d) + int64_t(h) * d;
      for (int e = lane; e < d; e += 32) {
        qs[r * d + e] = qr[e];
        dos[r * d + e] = dor[e];
      }
      if (hi[r] > lo[r]) {
        wlo = min(wlo, lo[r]);
        whi = max(whi, hi[r]);
      }
    }
  }
  int64_t blo, bhi;
  block_key_range(wlo, whi, warp_lo, warp_hi, blo, bhi);
  float acc[R][DT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < DT; ++t) acc[r][t] = 0.0f;
  for (int64_t c0 = blo; c0 < bhi; c0 += 32) {
    const int count = int(min(int64_t(32), bhi - c0));
    __syncthreads();  // the previous chunk is done with
    for (int64_t x = threadIdx.x; x < int64_t(count) * d; x += blockDim.x) {
      const int jj = int(x / d), e = int(x - int64_t(jj) * d);
      ks[jj * (d + 1) + e] = P.k[P.kl.at(bi, c0 + jj, grp, d) + e];
      vs[jj * (d + 1) + e] = P.v[P.vl.at(bi, c0 + jj, grp, d) + e];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (c0 >= hi[r] || c0 + 32 <= lo[r]) continue;  // warp-uniform: the row sees none of it
      const int64_t j = c0 + lane;
      const int64_t row = bh * P.sq + i0 + r;
      float ds = 0.0f;
      if (lane < count && j >= lo[r] && j < hi[r] && P.key_usable(bi, j)) {
        const float* kj = ks + lane * (d + 1);
        const float* vj = vs + lane * (d + 1);
        const float* q = qs + r * d;
        const float* dov = dos + r * d;
        float qk = 0.0f, dp = 0.0f;
        for (int e = 0; e < d; ++e) {
          qk += q[e] * kj[e];
          dp += dov[e] * vj[e];
        }
        const float pr = prob(P, G, row, G.probs ? 0.0f : qk, lse_r[r], bi, h, pos[r], j);
        ds = pr * (dp * P.keep(bi, h, pos[r], j) - delta_r[r]);
        if (G.dbias) atomicAdd(G.dbias + P.bias_index(bi, h, pos[r], P.k_position(j)), ds);
      }
      for (int jj = 0; jj < count; ++jj) {
        const float dsj = __shfl_sync(kFull, ds, jj);
        if (dsj == 0.0f) continue;  // the same for every lane
        const float* kr = ks + jj * (d + 1);
#pragma unroll
        for (int t = 0; t < DT; ++t)
          if (lane + 32 * t < d) acc[r][t] += dsj * kr[lane + 32 * t];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    if (i >= P.sq) continue;
    float* dq = G.dq + G.dql.at(bi, i, h, d);
#pragma unroll
    for (int t = 0; t < DT; ++t) {
      const int e = lane + 32 * t;
      if (e < d) dq[e] = P.scale * acc[r][t] + (G.accumulate ? dq[e] : 0.0f);
    }
  }
}

// dK and dV: a block holds kWarps * R consecutive key rows of one (bi, group). For each head of
// the group it walks the query rows in chunks of 32, skipping chunks where no query sees any of
// the block's keys; a chunk's Q and dO rows (padded pitch), log-sum-exps, D values, positions and
// key ranges are staged in shared memory once for the block. Per key row: lane t forms P and dS
// for query c0 + t, then dK += dS_i Q_i and dV += P_i keep dO_i with each broadcast from its
// lane. Dynamic shared memory: qs, dos [32][d + 1], kk and vv [kWarps][R][d].
template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dkv_kernel(Plan P, Grads G, int64_t tiles) {
  constexpr int R = RowsPerWarp<DT>::value;
  extern __shared__ float smem[];
  __shared__ int64_t c_lo[32], c_hi[32], c_pos[32];
  __shared__ float c_lse[32], c_delta[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, d = P.d;
  const int64_t bg = blockIdx.x / tiles;
  const int64_t j0 = (blockIdx.x % tiles) * (kWarps * R);  // the block's first key row
  const int64_t bi = bg / P.g;
  const int grp = int(bg % P.g);
  const int64_t kend = min(P.skv, j0 + kWarps * R);       // one past the block's last key row
  float* qs = smem;
  float* dos = qs + 32 * (d + 1);
  float* kk = dos + 32 * (d + 1) + int64_t(warp) * R * d;
  float* vv = kk + int64_t(kWarps) * R * d;
  bool usable[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t j = j0 + warp * R + r;
    usable[r] = j < P.skv && P.key_usable(bi, j);
    if (j < P.skv) {
      const float* kr = P.k + P.kl.at(bi, j, grp, d);
      const float* vr = P.v + P.vl.at(bi, j, grp, d);
      for (int e = lane; e < d; e += 32) {
        kk[r * d + e] = kr[e];
        vv[r * d + e] = vr[e];
      }
    }
  }
  __syncwarp();
  float acc_k[R][DT], acc_v[R][DT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < DT; ++t) acc_k[r][t] = acc_v[r][t] = 0.0f;
  const int64_t ctx = int64_t(P.n) * d;
  for (int hh = 0; hh < P.hpg; ++hh) {
    const int h = grp * P.hpg + hh;
    for (int64_t c0 = 0; c0 < P.sq; c0 += 32) {
      const int count = int(min(int64_t(32), P.sq - c0));
      __syncthreads();  // the previous chunk is done with
      int sees = 0;
      if (threadIdx.x < 32) {
        const int64_t i = c0 + threadIdx.x, row = (bi * P.n + h) * P.sq + i;
        int64_t lo = 0, hi = 0;
        float l = -INFINITY;
        if (threadIdx.x < count) {
          l = G.lse[row];
          if (l != -INFINITY) P.key_range(bi, i, lo, hi);
          c_pos[threadIdx.x] = P.q_position(bi, i);
          c_delta[threadIdx.x] = G.delta[row];
        }
        if (l == -INFINITY) hi = lo;  // the row saw no key: no gradient
        c_lo[threadIdx.x] = lo;
        c_hi[threadIdx.x] = hi;
        c_lse[threadIdx.x] = l;
        sees = hi > lo && lo < kend && hi > j0;
      }
      if (!__syncthreads_or(sees)) continue;  // no query of the chunk sees the block's keys
      for (int64_t x = threadIdx.x; x < int64_t(count) * d; x += blockDim.x) {
        const int ii = int(x / d), e = int(x - int64_t(ii) * d);
        const int64_t i = c0 + ii;
        qs[ii * (d + 1) + e] = P.q[P.ql.at(bi, i, h, d) + e];
        dos[ii * (d + 1) + e] = G.dout[(bi * P.sq + i) * ctx + int64_t(h) * d + e];
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t j = j0 + warp * R + r;
        if (!usable[r]) continue;  // warp-uniform
        float pd = 0.0f, ds = 0.0f;
        if (lane < count && j >= c_lo[lane] && j < c_hi[lane]) {
          const int64_t i = c0 + lane, row = (bi * P.n + h) * P.sq + i;
          const int64_t p = c_pos[lane];
          const float* qi = qs + lane * (d + 1);
          const float* doi = dos + lane * (d + 1);
          const float* k = kk + r * d;
          const float* v = vv + r * d;
          float qk = 0.0f, dp = 0.0f;
          for (int e = 0; e < d; ++e) {
            qk += k[e] * qi[e];
            dp += v[e] * doi[e];
          }
          const float pr = prob(P, G, row, G.probs ? 0.0f : qk, c_lse[lane], bi, h, p, j);
          const float keep = P.keep(bi, h, p, j);
          pd = pr * keep;
          ds = pr * (dp * keep - c_delta[lane]);
        }
        if (__ballot_sync(kFull, pd != 0.0f || ds != 0.0f) == 0) continue;
        for (int ii = 0; ii < count; ++ii) {
          const float pdi = __shfl_sync(kFull, pd, ii), dsi = __shfl_sync(kFull, ds, ii);
          if (pdi == 0.0f && dsi == 0.0f) continue;
          const float* qr = qs + ii * (d + 1);
          const float* dor = dos + ii * (d + 1);
#pragma unroll
          for (int t = 0; t < DT; ++t) {
            const int e = lane + 32 * t;
            if (e < d) {
              acc_k[r][t] += dsi * qr[e];
              acc_v[r][t] += pdi * dor[e];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t j = j0 + warp * R + r;
    if (j >= P.skv) continue;
    float* dk = G.dk + G.dkl.at(bi, j, grp, d);
    float* dv = G.dv + G.dvl.at(bi, j, grp, d);
#pragma unroll
    for (int t = 0; t < DT; ++t) {
      const int e = lane + 32 * t;
      if (e < d) {
        dk[e] = P.scale * acc_k[r][t] + (G.accumulate ? dk[e] : 0.0f);
        dv[e] = acc_v[r][t] + (G.accumulate ? dv[e] : 0.0f);
      }
    }
  }
}

}  // namespace

void launch_delta(const Plan& P, const float* dout, const float* out, float* delta) {
  const int64_t rows = P.b * P.n * P.sq;
  if (rows == 0) return;
  delta_kernel<<<detail::grid_for(rows, kWarps, INT32_MAX), kWarps * 32, 0, detail::stream()>>>(
      P, dout, out, delta);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace attn

void attention_bwd(const ops::AttentionGrads& grads, const Tensor& dout, const Tensor& out,
                   const Tensor& lse, const Tensor& probs, const ops::AttentionInputs& in,
                   const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                   const ops::DropoutSpec& dropout, bool accumulate) {
  const char* op = "attention_bwd";
  Tensor slopes;
  if (attn::half_operands(op, in)) {  // bf16: the tensor cores where the call fits them
    if (!probs.defined() && !grads.dbias.defined()) {
      const attn::Plan H = attn::make_plan(op, in, mask, shape, dropout, slopes, true);
      if (attn::tc_eligible(H)) {
        MG_CHECK(H.kv_index == nullptr, op, ": kv_index (KV-cache attention) has no backward");
        const int64_t ctx = int64_t(H.n) * H.d, rows = H.b * H.n * H.sq;
        attn::require_numel(op, "dout", dout, H.b * H.sq * ctx);
        attn::require_numel(op, "out", out, H.b * H.sq * ctx);
        attn::require_numel(op, "lse", lse, rows);
        float* dq = attn::grad_operand(op, "dq", grads.dq, in.q_layout, H.b, H.sq, H.n, H.d);
        float* dk = attn::grad_operand(op, "dk", grads.dk, in.k_layout, H.b, H.skv, H.g, H.d);
        float* dv = attn::grad_operand(op, "dv", grads.dv, in.v_layout, H.b, H.skv, H.g, H.d);
        attn::tc_bwd(op, H, dq, dk, dv, dout, out.data<float>(), lse.data<float>(), accumulate);
        return;
      }
    }
    return cuda::attention_bwd(grads, dout, out, lse, probs, attn::with_f32_operands(in), mask,
                               shape, dropout, accumulate);
  }
  const attn::Plan P = attn::make_plan(op, in, mask, shape, dropout, slopes);
  MG_CHECK(P.kv_index == nullptr, op, ": kv_index (KV-cache attention) has no backward");
  const int64_t ctx = int64_t(P.n) * P.d, rows = P.b * P.n * P.sq;
  attn::require_numel(op, "dout", dout, P.b * P.sq * ctx);
  attn::require_numel(op, "out", out, P.b * P.sq * ctx);
  attn::require_numel(op, "lse", lse, rows);
  if (probs.defined()) attn::require_numel(op, "probs", probs, rows * P.skv);
  attn::Grads G;
  G.dq = attn::grad_operand(op, "dq", grads.dq, in.q_layout, P.b, P.sq, P.n, P.d);
  G.dk = attn::grad_operand(op, "dk", grads.dk, in.k_layout, P.b, P.skv, P.g, P.d);
  G.dv = attn::grad_operand(op, "dv", grads.dv, in.v_layout, P.b, P.skv, P.g, P.d);
  G.dql = P.ql;
  G.dkl = P.kl;
  G.dvl = P.vl;
  G.dout = dout.data<float>();
  G.out = out.data<float>();
  G.lse = lse.data<float>();
  G.probs = probs.defined() ? probs.data<float>() : nullptr;
  G.accumulate = accumulate;
  if (grads.dbias.defined()) {
    MG_CHECK(P.bias != nullptr, op, ": dbias without a bias");
    attn::require_numel(op, "dbias", grads.dbias, in.bias.numel());
    if (!accumulate)
      MG_CUDA_CHECK(cudaMemsetAsync(grads.dbias.data<float>(), 0,
                                    size_t(grads.dbias.numel()) * sizeof(float),
                                    detail::stream()));
    G.dbias = grads.dbias.data<float>();
  }
  const int64_t keys = P.b * P.g * P.skv;
  Tensor delta;
  if (rows > 0) {
    delta = Tensor::empty({rows}, DType::F32, dout.device());
    G.delta = delta.data<float>();
    attn::launch_delta(P, G.dout, G.out, G.delta);
  }
  attn::with_head_chunks(op, P.d, [&]<int DT>(std::integral_constant<int, DT>) {
    const int64_t per_block = attn::kWarps * attn::RowsPerWarp<DT>::value;
    // Both kernels: two staged chunks of 32 rows (padded pitch) and two rows per warp row.
    const size_t bytes = size_t(2 * 32 * (P.d + 1) + 2 * per_block * P.d) * sizeof(float);
    if (rows > 0) {
      const int64_t tiles = (P.sq + per_block - 1) / per_block;
      const auto kernel = attn::dq_kernel<DT>;
      attn::allow_shared(op, kernel, bytes);
      kernel<<<attn::block_count(op, P.b * P.n * tiles), attn::kWarps * 32, bytes,
               detail::stream()>>>(P, G, tiles);
      MG_CUDA_LAUNCH_CHECK();
    }
    if (keys > 0) {
      const int64_t tiles = (P.skv + per_block - 1) / per_block;
      const auto kernel = attn::dkv_kernel<DT>;
      attn::allow_shared(op, kernel, bytes);
      kernel<<<attn::block_count(op, P.b * P.g * tiles), attn::kWarps * 32, bytes,
               detail::stream()>>>(P, G, tiles);
      MG_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace megatron::cuda
