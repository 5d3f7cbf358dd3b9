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
__global__ void delta_kernel(Plan P, Grads G) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarps) + warp;
  if (row >= P.b * P.n * P.sq) return;
  const int64_t i = row % P.sq, bi = row / (P.sq * P.n);
  const int h = int((row / P.sq) % P.n);
  const int64_t at = (bi * P.sq + i) * (int64_t(P.n) * P.d) + int64_t(h) * P.d;
  float s = 0.0f;
  for (int e = lane; e < P.d; e += 32) s += G.dout[at + e] * G.out[at + e];
  s = warp_sum(s);
  if (lane == 0) G.delta[row] = s;
}

// P of query row (bi, h, i) at position p (log-sum-exp lse_i) and key row j, qk = q_i . k_j.
__device__ inline float prob(const Plan& P, const Grads& G, int64_t row, float qk, float lse_i,
                             int64_t bi, int h, int64_t p, int64_t j) {
  if (G.probs) return G.probs[row * P.skv + j];
  return expf(P.score(qk, bi, h, p, j) - lse_i);
}

// One warp per query row (bi, h, i): dQ (and dbias).
template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dq_kernel(Plan P, Grads G) {
  __shared__ float q_shared[kWarps][kMaxHeadDim], do_shared[kWarps][kMaxHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarps) + warp;
  if (row >= P.b * P.n * P.sq) return;
  const int64_t i = row % P.sq, bi = row / (P.sq * P.n);
  const int h = int((row / P.sq) % P.n), grp = h / P.hpg, d = P.d;
  float *qs = q_shared[warp], *dos = do_shared[warp];
  const float* qr = P.q + P.ql.at(bi, i, h, d);
  const float* dor = G.dout + (bi * P.sq + i) * (int64_t(P.n) * d) + int64_t(h) * d;
  for (int e = lane; e < d; e += 32) {
    qs[e] = qr[e];
    dos[e] = dor[e];
  }
  __syncwarp();
  const float lse_i = G.lse[row], D = G.delta[row];
  int64_t lo, hi;
  P.key_range(bi, i, lo, hi);
  if (lse_i == -INFINITY) hi = lo;  // the row saw no key: no gradient
  const int64_t p = P.q_position(bi, i);
  float acc[DT];
#pragma unroll
  for (int t = 0; t < DT; ++t) acc[t] = 0.0f;
  for (int64_t c0 = lo; c0 < hi; c0 += 32) {
    const int64_t j = c0 + lane;
    float ds = 0.0f;
    if (j < hi && P.key_usable(bi, j)) {
      const float* kr = P.k + P.kl.at(bi, j, grp, d);
      const float pr = prob(P, G, row, G.probs ? 0.0f : row_dot(qs, kr, d), lse_i, bi, h, p, j);
      const float dp = row_dot(dos, P.v + P.vl.at(bi, j, grp, d), d);
      ds = pr * (dp * P.keep(bi, h, p, j) - D);
      if (G.dbias) atomicAdd(G.dbias + P.bias_index(bi, h, p, P.k_position(j)), ds);
    }
    const int count = int(min(int64_t(32), hi - c0));
    for (int jj = 0; jj < count; ++jj) {
      const float dsj = __shfl_sync(kFull, ds, jj);
      if (dsj == 0.0f) continue;  // the same for every lane
      const float* kr = P.k + P.kl.at(bi, c0 + jj, grp, d);
#pragma unroll
      for (int t = 0; t < DT; ++t)
        if (lane + 32 * t < d) acc[t] += dsj * kr[lane + 32 * t];
    }
  }
  float* dq = G.dq + G.dql.at(bi, i, h, d);
#pragma unroll
  for (int t = 0; t < DT; ++t) {
    const int e = lane + 32 * t;
    if (e < d) dq[e] = P.scale * acc[t] + (G.accumulate ? dq[e] : 0.0f);
  }
}

// One warp per key row (bi, group, j): dK and dV over the group's heads and their query rows.
template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dkv_kernel(Plan P, Grads G) {
  __shared__ float k_shared[kWarps][kMaxHeadDim], v_shared[kWarps][kMaxHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t key = blockIdx.x * int64_t(kWarps) + warp;
  if (key >= P.b * P.g * P.skv) return;
  const int64_t j = key % P.skv, bi = key / (P.skv * P.g);
  const int grp = int((key / P.skv) % P.g), d = P.d;
  float *ks = k_shared[warp], *vs = v_shared[warp];
  const float* kr = P.k + P.kl.at(bi, j, grp, d);
  const float* vr = P.v + P.vl.at(bi, j, grp, d);
  for (int e = lane; e < d; e += 32) {
    ks[e] = kr[e];
    vs[e] = vr[e];
  }
  __syncwarp();
  float acc_k[DT], acc_v[DT];
#pragma unroll
  for (int t = 0; t < DT; ++t) acc_k[t] = acc_v[t] = 0.0f;
  const int64_t ctx = int64_t(P.n) * d;
  if (P.key_usable(bi, j)) {
    for (int hh = 0; hh < P.hpg; ++hh) {
      const int h = grp * P.hpg + hh;
      for (int64_t c0 = 0; c0 < P.sq; c0 += 32) {
        const int64_t i = c0 + lane, row = (bi * P.n + h) * P.sq + i;
        float pd = 0.0f, ds = 0.0f;
        if (i < P.sq && G.lse[row] != -INFINITY) {
          int64_t lo, hi;
          P.key_range(bi, i, lo, hi);
          if (j >= lo && j < hi) {
            const int64_t p = P.q_position(bi, i);
            const float* qr = P.q + P.ql.at(bi, i, h, d);
            const float* dor = G.dout + (bi * P.sq + i) * ctx + int64_t(h) * d;
            const float pr =
                prob(P, G, row, G.probs ? 0.0f : row_dot(ks, qr, d), G.lse[row], bi, h, p, j);
            const float keep = P.keep(bi, h, p, j);
            pd = pr * keep;
            ds = pr * (row_dot(vs, dor, d) * keep - G.delta[row]);
          }
        }
        if (__ballot_sync(kFull, pd != 0.0f || ds != 0.0f) == 0) continue;
        const int count = int(min(int64_t(32), P.sq - c0));
        for (int ii = 0; ii < count; ++ii) {
          const float pdi = __shfl_sync(kFull, pd, ii), dsi = __shfl_sync(kFull, ds, ii);
          if (pdi == 0.0f && dsi == 0.0f) continue;
          const float* qr = P.q + P.ql.at(bi, c0 + ii, h, d);
          const float* dor = G.dout + (bi * P.sq + c0 + ii) * ctx + int64_t(h) * d;
#pragma unroll
          for (int t = 0; t < DT; ++t) {
            const int e = lane + 32 * t;
            if (e < d) {
              acc_k[t] += dsi * qr[e];
              acc_v[t] += pdi * dor[e];
            }
          }
        }
      }
    }
  }
  float* dk = G.dk + G.dkl.at(bi, j, grp, d);
  float* dv = G.dv + G.dvl.at(bi, j, grp, d);
#pragma unroll
  for (int t = 0; t < DT; ++t) {
    const int e = lane + 32 * t;
    if (e < d) {
      dk[e] = P.scale * acc_k[t] + (G.accumulate ? dk[e] : 0.0f);
      dv[e] = acc_v[t] + (G.accumulate ? dv[e] : 0.0f);
    }
  }
}

}  // namespace

}  // namespace attn

void attention_bwd(const ops::AttentionGrads& grads, const Tensor& dout, const Tensor& out,
                   const Tensor& lse, const Tensor& probs, const ops::AttentionInputs& in,
                   const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                   const ops::DropoutSpec& dropout, bool accumulate) {
  const char* op = "attention_bwd";
  Tensor slopes;
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
    attn::delta_kernel<<<detail::grid_for(rows, attn::kWarps, INT32_MAX), attn::kWarps * 32, 0,
                         detail::stream()>>>(P, G);
    MG_CUDA_LAUNCH_CHECK();
  }
  attn::with_head_chunks(op, P.d, [&]<int DT>(std::integral_constant<int, DT>) {
    if (rows > 0) {
      attn::dq_kernel<DT><<<detail::grid_for(rows, attn::kWarps, INT32_MAX), attn::kWarps * 32,
                            0, detail::stream()>>>(P, G);
      MG_CUDA_LAUNCH_CHECK();
    }
    if (keys > 0) {
      attn::dkv_kernel<DT><<<detail::grid_for(keys, attn::kWarps, INT32_MAX), attn::kWarps * 32,
                             0, detail::stream()>>>(P, G);
      MG_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace megatron::cuda
