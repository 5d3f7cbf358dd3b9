// The core attention op on the GPU's tensor cores: bf16 q, k and v (a bf16 model's activations)
// under the masks a GPT, Llama or BERT layer uses in training (causal or bidirectional, grouped
// query heads, dropout on the probabilities), head dim 64 or 128. Flash-attention style (Dao,
// FlashAttention-2): tiles of 64 query rows against tiles of 64 keys, the products Q K^T and P V
// (and in backward dO V^T, P^T dO, dS^T Q, dS K) as warp-level bf16 matrix products with fp32
// accumulation (mma.sync m16n8k16), the softmax online in fp32 registers. The probabilities and
// the incoming gradient are rounded to bf16 for their products, as the CPU's bf16 kernel does
// (cpu_attention_bf16.h); lse, every output and every gradient stay fp32. Calls outside this set
// (positions, padding, bias, ALiBi, windows, the KV cache, saved probabilities) take the general
// kernels of attention.cu and attention_bwd.cu on fp32 copies of the operands.
//
// A block is 4 warps; each warp owns 16 rows of its tile. In the fragments of m16n8k16 a lane
// (g = lane / 4, t = lane % 4) holds rows g and g + 8 and columns 2t, 2t + 1 (+ 8) of each 16 x 16
// (A) or 16 x 8 (B, C) piece; the accumulator layout of two neighbouring 8-column pieces is the A
// layout of the next product, so P and dS never leave registers. Backward: one kernel for dK and
// dV (a block per 64 keys of a key head, walking its heads' query tiles) and one for dQ (a block per
// 64 query rows, walking the key tiles), so every gradient row is written by one warp: no atomics,
// results that do not depend on scheduling.
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace megatron::cuda::attn {

namespace {

constexpr int kTile = 64;           // query rows and key rows per tile
constexpr int kTcThreads = 128;     // 4 warps x 16 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
using bf16 = __nv_bfloat16;

// D += A B, A 16 x 16 (row-major fragments a[4]), B 16 x 8 (b0, b1), D 16 x 8 fp32.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Two neighbouring bf16 (4-byte aligned).
__device__ __forceinline__ uint32_t ld32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// One operand head's rows: row r at base + r * stride (bf16).
struct Rows {
  const bf16* base;
  int64_t stride, count;
};
// The `count` rows of head `head` (of head dim D) of sequence `seq` of an operand read through
// layout L.
template <int D>
__device__ __forceinline__ Rows rows_of(const bf16* src, const Layout& L, int64_t seq, int head,
                                        int64_t count) {
  return Rows{src + L.at(seq, 0, head, D), L.row_stride, count};
}

// kTile rows [row0, row0 + kTile) into dst [kTile][D + 8] (the pitch keeps a warp's ldmatrix
// rows on distinct banks), rows at or past the end zeros; asynchronous 16-byte copies (cp.async,
// zero-filled past the end), completed by cp_async_wait and a barrier. Eligibility checked the
// alignment.
template <int D>
__device__ __forceinline__ void load_tile_async(bf16* dst, const Rows& R, int64_t row0) {
  constexpr int C = D / 8;
  for (int x = threadIdx.x; x < kTile * C; x += kTcThreads) {
    const int r = x / C, c = x % C;
    const bool in = row0 + r < R.count;
    const bf16* src = in ? R.base + (row0 + r) * R.stride + c * 8 : R.base;
    const uint32_t d = uint32_t(__cvta_generic_to_shared(dst + r * (D + 8) + c * 8));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(in ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The same from fp32 rows `stride` apart (the incoming gradient), rounded to bf16.
template <int D>
__device__ void load_tile_f32(bf16* dst, const float* src, int64_t stride, int64_t row0,
                              int64_t rows) {
  constexpr int C = D / 4;
  for (int x = threadIdx.x; x < kTile * C; x += kTcThreads) {
    const int r = x / C, c = x % C;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row0 + r < rows) v = *reinterpret_cast<const float4*>(src + (row0 + r) * stride + c * 4);
    *reinterpret_cast<uint2*>(dst + r * (D + 8) + c * 4) =
        make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
}

// A fragments [D / 16][4] of rows ra and rb (= ra + 8) of a bf16 operand (null: a row past the end).
template <int D>
__device__ void row_fragments(uint32_t (&a)[D / 16][4], const bf16* ra, const bf16* rb, int t) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int e = ks * 16 + 2 * t;
    a[ks][0] = ra ? ld32(ra + e) : 0u;
    a[ks][1] = rb ? ld32(rb + e) : 0u;
    a[ks][2] = ra ? ld32(ra + e + 8) : 0u;
    a[ks][3] = rb ? ld32(rb + e + 8) : 0u;
  }
}
// The same from fp32 rows, rounded to bf16.
template <int D>
__device__ void row_fragments_f32(uint32_t (&a)[D / 16][4], const float* ra, const float* rb,
                                  int t) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int e = ks * 16 + 2 * t;
    float2 x = ra ? *reinterpret_cast<const float2*>(ra + e) : make_float2(0.0f, 0.0f);
    a[ks][0] = pack_bf16(x.x, x.y);
    x = rb ? *reinterpret_cast<const float2*>(rb + e) : make_float2(0.0f, 0.0f);
    a[ks][1] = pack_bf16(x.x, x.y);
    x = ra ? *reinterpret_cast<const float2*>(ra + e + 8) : make_float2(0.0f, 0.0f);
    a[ks][2] = pack_bf16(x.x, x.y);
    x = rb ? *reinterpret_cast<const float2*>(rb + e + 8) : make_float2(0.0f, 0.0f);
    a[ks][3] = pack_bf16(x.x, x.y);
  }
}

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix): lane l gives the address of row l % 8 of
// matrix l / 8 (16 bytes, 16-byte aligned) and receives in r[i] elements (l / 4, 2 (l % 4) .. + 1)
// of matrix i; with the transpose, elements (2 (l % 4) .. + 1, l / 4), i.e. of matrix i's transpose.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_t(uint32_t (&r)[4], const bf16* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The A fragments of rows [row0, row0 + 16), columns [ks * 16, ks * 16 + 16) of a tile [64][D + 8]:
// matrices (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8) are a[0..3].
template <int D>
__device__ __forceinline__ void tile_a_fragment(uint32_t (&a)[4], const bf16* s, int row0, int ks,
                                                int lane) {
  const int m = lane >> 3, r = lane & 7;
  ldmatrix_x4(a, s + (row0 + (m & 1) * 8 + r) * (D + 8) + ks * 16 + (m >> 1) * 8);
}

// acc[8][4] (16 rows x 64 tile columns) += A (16 x D, fragments) times the rows of tile s^T:
// column c of the result is row c of s (B[k][n] = s[n][k]). Per pair of 8-column pieces one
// ldmatrix: matrices (rows nt * 8, cols +0), (nt * 8, +8), (nt * 8 + 8, +0), (nt * 8 + 8, +8) are
// b0, b1 of piece nt and b0, b1 of piece nt + 1.
template <int D>
__device__ __forceinline__ void times_rows_t(float (&acc)[8][4], const uint32_t (&a)[4],
                                             const bf16* s, int ks, int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16* base = s + ((m >> 1) * 8 + r) * (D + 8) + ks * 16 + (m & 1) * 8;
#pragma unroll
  for (int nt = 0; nt < 8; nt += 2) {
    uint32_t b[4];
    ldmatrix_x4(b, base + nt * 8 * (D + 8));
    mma16816(acc[nt], a, b[0], b[1]);
    mma16816(acc[nt + 1], a, b[2], b[3]);
  }
}

// acc[D / 8][4] (16 rows x D) += A (16 x 64 tile rows, fragments pa[4][4]) times tile s [64][D]
// (B[k][n] = s[k][n]): transposed ldmatrix, matrices (rows kk * 16, cols nd * 8), (kk * 16 + 8,
// nd * 8), (kk * 16, nd * 8 + 8), (kk * 16 + 8, nd * 8 + 8) are b0, b1 of pieces nd and nd + 1.
template <int D>
__device__ __forceinline__ void times_tile(float (&acc)[D / 8][4], const uint32_t (&pa)[4][4],
                                           const bf16* s, int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16* base = s + ((m & 1) * 8 + r) * (D + 8) + (m >> 1) * 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t b[4];
      ldmatrix_x4_t(b, base + kk * 16 * (D + 8) + nd * 8);
      mma16816(acc[nd], pa[kk], b[0], b[1]);
      mma16816(acc[nd + 1], pa[kk], b[2], b[3]);
    }
  }
}

// Stores two columns of a fragment row (fp32), adding to what is there when accumulating.
__device__ __forceinline__ void put2(float* p, float a, float b, bool accumulate) {
  float2 v = make_float2(a, b);
  if (accumulate) {
    const float2 o = *reinterpret_cast<const float2*>(p);
    v.x += o.x;
    v.y += o.y;
  }
  *reinterpret_cast<float2*>(p) = v;
}

// ---- forward ---------------------------------------------------------------------------------
template <int D, bool DROP>
__global__ void __launch_bounds__(kTcThreads)
    tc_fwd_kernel(Plan P, float* out, float* lse, int64_t qtiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kTileElems = kTile * (D + 8);
  bf16* tiles = reinterpret_cast<bf16*>(smem_raw);  // [2 buffers][K, V][kTile][D + 8]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t qt = qtiles - 1 - int64_t(blockIdx.x % qtiles);  // the longest rows first
  const int64_t bh = blockIdx.x / qtiles, bi = bh / P.n;
  const int h = int(bh % P.n), grp = h / P.hpg;
  const int64_t q0 = qt * kTile, rA = q0 + warp * 16 + g, rB = rA + 8;
  const Rows Kr = rows_of<D>(P.kh, P.kl, bi, grp, P.skv), Vr = rows_of<D>(P.vh, P.vl, bi, grp, P.skv);
  load_tile_async<D>(tiles, Kr, 0);
  load_tile_async<D>(tiles + kTileElems, Vr, 0);
  cp_async_commit();
  uint32_t qa[D / 16][4];
  row_fragments<D>(qa, rA < P.sq ? P.qh + P.ql.at(bi, rA, h, D) : nullptr,
                   rB < P.sq ? P.qh + P.ql.at(bi, rB, h, D) : nullptr, t);
  float o[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;  // maxima in log2 units
  const float sl2 = P.scale * kLog2e;
  const int64_t kv_end = P.causal ? min(P.skv, q0 + kTile) : P.skv;
  for (int64_t k0 = 0, buf = 0; k0 < kv_end; k0 += kTile, buf ^= 1) {
    // The next tile's copies go out before this tile's products (double buffering).
    if (k0 + kTile < kv_end) {
      load_tile_async<D>(tiles + (buf ^ 1) * 2 * kTileElems, Kr, k0 + kTile);
      load_tile_async<D>(tiles + (buf ^ 1) * 2 * kTileElems + kTileElems, Vr, k0 + kTile);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile is in shared memory for every warp
    const bf16* Ks = tiles + buf * 2 * kTileElems;
    const bf16* Vs = Ks + kTileElems;
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) times_rows_t<D>(s, qa[ks], Ks, ks, lane);
    float tA = -INFINITY, tB = -INFINITY;
    // Every key of the tile visible to every row of the block: no mask to form (block-uniform).
    if ((!P.causal || k0 + kTile - 1 <= q0) && k0 + kTile <= P.skv) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[nt][c] *= sl2;
          if (c < 2) tA = fmaxf(tA, s[nt][c]); else tB = fmaxf(tB, s[nt][c]);
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t key = k0 + nt * 8 + 2 * t + (c & 1), row = c < 2 ? rA : rB;
          const bool visible = key < P.skv && (!P.causal || key <= row);
          s[nt][c] = visible ? s[nt][c] * sl2 : -INFINITY;
          if (c < 2) tA = fmaxf(tA, s[nt][c]); else tB = fmaxf(tB, s[nt][c]);
        }
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      tA = fmaxf(tA, __shfl_xor_sync(kFull, tA, o2));
      tB = fmaxf(tB, __shfl_xor_sync(kFull, tB, o2));
    }
    const float nA = fmaxf(mA, tA), nB = fmaxf(mB, tB);
    const float uA = nA == -INFINITY ? 0.0f : nA, uB = nB == -INFINITY ? 0.0f : nB;
    const float aA = exp2f(mA - uA), aB = exp2f(mB - uB);
    mA = nA;
    mB = nB;
    lA *= aA;
    lB *= aB;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      o[nd][0] *= aA;
      o[nd][1] *= aA;
      o[nd][2] *= aB;
      o[nd][3] *= aB;
    }
    uint32_t pa[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      float p[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) p[c] = exp2f(s[nt][c] - (c < 2 ? uA : uB));
      lA += p[0] + p[1];
      lB += p[2] + p[3];
      if constexpr (DROP) {
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (p[c] != 0.0f) p[c] *= P.keep(bi, h, c < 2 ? rA : rB, k0 + nt * 8 + 2 * t + (c & 1));
      }
      pa[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(p[0], p[1]);
      pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
    }
    times_tile<D>(o, pa, Vs, lane);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    lA += __shfl_xor_sync(kFull, lA, o2);
    lB += __shfl_xor_sync(kFull, lB, o2);
  }
  const int64_t width = int64_t(P.n) * D;
  const float iA = lA > 0.0f ? 1.0f / lA : 0.0f, iB = lB > 0.0f ? 1.0f / lB : 0.0f;
  if (rA < P.sq) {
    float* dst = out + (bi * P.sq + rA) * width + int64_t(h) * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) put2(dst + nd * 8, o[nd][0] * iA, o[nd][1] * iA, false);
    if (lse && t == 0) lse[bh * P.sq + rA] = lA > 0.0f ? mA * kLn2 + logf(lA) : -INFINITY;
  }
  if (rB < P.sq) {
    float* dst = out + (bi * P.sq + rB) * width + int64_t(h) * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) put2(dst + nd * 8, o[nd][2] * iB, o[nd][3] * iB, false);
    if (lse && t == 0) lse[bh * P.sq + rB] = lB > 0.0f ? mB * kLn2 + logf(lB) : -INFINITY;
  }
}

// ---- backward --------------------------------------------------------------------------------
struct TcGrads {
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const float *dout = nullptr, *out = nullptr, *lse = nullptr;
  const bf16* dout_h = nullptr;  // dout rounded to bf16 (the dK, dV kernel's tiles)
  float* delta = nullptr;  // [b, n, sq]: rowsum(dO * O)
  bool accumulate = false;
};

// dK and dV of 64 keys of key head grp: K and V tiles stay in shared memory; per query head of the
// group and per query tile (from the keys' own tile on, when causal): S^T = K Q^T and
// dP^T = V dO^T, then P^T, dS^T = P^T (keep dP^T - delta), dV += (P^T keep) dO, dK += dS^T Q.
template <int D, bool DROP>
__global__ void __launch_bounds__(kTcThreads) tc_dkv_kernel(Plan P, TcGrads G, int64_t ktiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kTileElems = kTile * (D + 8);
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + kTileElems;
  bf16* qo = Vs + kTileElems;  // [2 buffers][Q, dO][kTile][D + 8]
  float* stats = reinterpret_cast<float*>(qo + 4 * kTileElems);  // [2 buffers][lse2, delta][kTile]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t kt = int64_t(blockIdx.x % ktiles), bgi = blockIdx.x / ktiles;
  const int64_t bi = bgi / P.g;
  const int grp = int(bgi % P.g);
  const int64_t k0 = kt * kTile, jA = k0 + warp * 16 + g, jB = jA + 8;
  load_tile_async<D>(Ks, rows_of<D>(P.kh, P.kl, bi, grp, P.skv), k0);
  load_tile_async<D>(Vs, rows_of<D>(P.vh, P.vl, bi, grp, P.skv), k0);
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int c = 0; c < 4; ++c) dk[nd][c] = dv[nd][c] = 0.0f;
  const float sl2 = P.scale * kLog2e;
  const int64_t width = int64_t(P.n) * D, qtiles = (P.sq + kTile - 1) / kTile;
  // The (head of the group, query tile) pairs in turn: from the keys' own tile on when causal.
  const int64_t qt0 = P.causal ? k0 / kTile : 0;
  const int64_t per_head = max(qtiles - qt0, int64_t(0)), pairs = per_head * P.hpg;
  // Queues the copies of pair `x`'s Q and dO tiles into buffer `buf`.
  const auto issue = [&](int64_t x, int64_t buf) {
    const int h = grp * P.hpg + int(x / per_head);
    const int64_t q0 = (qt0 + x % per_head) * kTile;
    load_tile_async<D>(qo + buf * 2 * kTileElems, rows_of<D>(P.qh, P.ql, bi, h, P.sq), q0);
    load_tile_async<D>(qo + buf * 2 * kTileElems + kTileElems,
                       Rows{G.dout_h + bi * P.sq * width + int64_t(h) * D, width, P.sq}, q0);
  };
  if (pairs > 0) issue(0, 0);
  cp_async_commit();
  for (int64_t x = 0, buf = 0; x < pairs; ++x, buf ^= 1) {
    const int h = grp * P.hpg + int(x / per_head);
    const int64_t bh = bi * P.n + h, q0 = (qt0 + x % per_head) * kTile;
    if (x + 1 < pairs) {  // the next pair's copies before this pair's products
      issue(x + 1, buf ^ 1);
      cp_async_commit();
    }
    float* lse2 = stats + buf * 2 * kTile;
    float* dls = lse2 + kTile;
    if (threadIdx.x < kTile) {
      const int64_t i = q0 + threadIdx.x;
      lse2[threadIdx.x] = i < P.sq ? G.lse[bh * P.sq + i] * kLog2e : 0.0f;
      dls[threadIdx.x] = i < P.sq ? G.delta[bh * P.sq + i] : 0.0f;
    }
    if (x + 1 < pairs) cp_async_wait<1>(); else cp_async_wait<0>();
    __syncthreads();  // this pair's tiles (and K, V) are in shared memory for every warp
    const bf16* Qs = qo + buf * 2 * kTileElems;
    const bf16* Os = Qs + kTileElems;  // dO
    {
      float st[8][4], dpt[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) st[nt][c] = dpt[nt][c] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t ka[4], va[4];
        tile_a_fragment<D>(ka, Ks, warp * 16, ks, lane);
        tile_a_fragment<D>(va, Vs, warp * 16, ks, lane);
        times_rows_t<D>(st, ka, Qs, ks, lane);
        times_rows_t<D>(dpt, va, Os, ks, lane);
      }
      // Every (query, key) pair of the two tiles visible: no mask to form (block-uniform).
      const bool full =
          (!P.causal || k0 + kTile - 1 <= q0) && q0 + kTile <= P.sq && k0 + kTile <= P.skv;
      uint32_t pa[4][4], dsa[4][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float pd[4], ds[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int ql = nt * 8 + 2 * t + (c & 1);
          const int64_t i = q0 + ql, key = c < 2 ? jA : jB;
          float p;
          if (full) {
            p = exp2f(fmaf(st[nt][c], sl2, -lse2[ql]));
          } else {
            const bool visible = i < P.sq && key < P.skv && (!P.causal || key <= i);
            p = visible ? exp2f(fmaf(st[nt][c], sl2, -lse2[ql])) : 0.0f;
          }
          float z = 1.0f;
          if constexpr (DROP) z = p != 0.0f ? P.keep(bi, h, i, key) : 0.0f;
          pd[c] = p * z;
          ds[c] = p * (dpt[nt][c] * z - dls[ql]);
        }
        pa[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(pd[0], pd[1]);
        pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(pd[2], pd[3]);
        dsa[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(ds[0], ds[1]);
        dsa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
      }
      times_tile<D>(dv, pa, Os, lane);
      times_tile<D>(dk, dsa, Qs, lane);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  cp_async_wait<0>();  // no copy outlives the block (keys no query sees: no loop ran)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t j = half ? jB : jA;
    if (j >= P.skv) continue;
    float* kd = G.dk + P.kl.at(bi, j, grp, D) + 2 * t;
    float* vd = G.dv + P.vl.at(bi, j, grp, D) + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      put2(kd + nd * 8, dk[nd][2 * half] * P.scale, dk[nd][2 * half + 1] * P.scale, G.accumulate);
      put2(vd + nd * 8, dv[nd][2 * half], dv[nd][2 * half + 1], G.accumulate);
    }
  }
}

// dQ of 64 query rows of head h: per key tile, S = Q K^T and dP = dO V^T, then
// dS = P (keep dP - delta) and dQ += dS K.
template <int D, bool DROP>
__global__ void __launch_bounds__(kTcThreads) tc_dq_kernel(Plan P, TcGrads G, int64_t qtiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kTileElems = kTile * (D + 8);
  bf16* tiles = reinterpret_cast<bf16*>(smem_raw);  // [2 buffers][K, V][kTile][D + 8]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t qt = qtiles - 1 - int64_t(blockIdx.x % qtiles);
  const int64_t bh = blockIdx.x / qtiles, bi = bh / P.n;
  const int h = int(bh % P.n), grp = h / P.hpg;
  const int64_t q0 = qt * kTile, rA = q0 + warp * 16 + g, rB = rA + 8;
  const int64_t width = int64_t(P.n) * D;
  const Rows Kr = rows_of<D>(P.kh, P.kl, bi, grp, P.skv), Vr = rows_of<D>(P.vh, P.vl, bi, grp, P.skv);
  load_tile_async<D>(tiles, Kr, 0);
  load_tile_async<D>(tiles + kTileElems, Vr, 0);
  cp_async_commit();
  uint32_t qa[D / 16][4], oa[D / 16][4];
  row_fragments<D>(qa, rA < P.sq ? P.qh + P.ql.at(bi, rA, h, D) : nullptr,
                   rB < P.sq ? P.qh + P.ql.at(bi, rB, h, D) : nullptr, t);
  row_fragments_f32<D>(oa, rA < P.sq ? G.dout + (bi * P.sq + rA) * width + int64_t(h) * D : nullptr,
                       rB < P.sq ? G.dout + (bi * P.sq + rB) * width + int64_t(h) * D : nullptr, t);
  const float lA = rA < P.sq ? G.lse[bh * P.sq + rA] * kLog2e : 0.0f;
  const float lB = rB < P.sq ? G.lse[bh * P.sq + rB] * kLog2e : 0.0f;
  const float dA = rA < P.sq ? G.delta[bh * P.sq + rA] : 0.0f;
  const float dB = rB < P.sq ? G.delta[bh * P.sq + rB] : 0.0f;
  float dq[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
  const float sl2 = P.scale * kLog2e;
  const int64_t kv_end = P.causal ? min(P.skv, q0 + kTile) : P.skv;
  for (int64_t k0 = 0, buf = 0; k0 < kv_end; k0 += kTile, buf ^= 1) {
    if (k0 + kTile < kv_end) {  // the next tile's copies before this tile's products
      load_tile_async<D>(tiles + (buf ^ 1) * 2 * kTileElems, Kr, k0 + kTile);
      load_tile_async<D>(tiles + (buf ^ 1) * 2 * kTileElems + kTileElems, Vr, k0 + kTile);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* Ks = tiles + buf * 2 * kTileElems;
    const bf16* Vs = Ks + kTileElems;
    float s[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[nt][c] = dp[nt][c] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      times_rows_t<D>(s, qa[ks], Ks, ks, lane);
      times_rows_t<D>(dp, oa[ks], Vs, ks, lane);
    }
    // Every key of the tile visible to every row of the block (rows past the end are not
    // written): no mask to form (block-uniform).
    const bool full = (!P.causal || k0 + kTile - 1 <= q0) && k0 + kTile <= P.skv;
    uint32_t dsa[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      float ds[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t key = k0 + nt * 8 + 2 * t + (c & 1), row = c < 2 ? rA : rB;
        float p;
        if (full) {
          p = exp2f(fmaf(s[nt][c], sl2, -(c < 2 ? lA : lB)));
        } else {
          const bool visible = row < P.sq && key < P.skv && (!P.causal || key <= row);
          p = visible ? exp2f(fmaf(s[nt][c], sl2, -(c < 2 ? lA : lB))) : 0.0f;
        }
        float z = 1.0f;
        if constexpr (DROP) z = p != 0.0f ? P.keep(bi, h, row, key) : 0.0f;
        ds[c] = p * (dp[nt][c] * z - (c < 2 ? dA : dB));
      }
      dsa[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(ds[0], ds[1]);
      dsa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
    }
    times_tile<D>(dq, dsa, Ks, lane);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = half ? rB : rA;
    if (r >= P.sq) continue;
    float* qd = G.dq + P.ql.at(bi, r, h, D) + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      put2(qd + nd * 8, dq[nd][2 * half] * P.scale, dq[nd][2 * half + 1] * P.scale, G.accumulate);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool layout_in_eights(const Layout& L) {
  return L.offset % 8 == 0 && L.seq_stride % 8 == 0 && L.row_stride % 8 == 0 &&
         L.group_stride % 8 == 0;
}

// fn(std::integral_constant<int, D>, std::integral_constant<bool, DROP>).
template <class Fn>
void with_tc_kernel(const Plan& P, Fn&& fn) {
  const bool drop = P.drop_p > 0.0f;
  if (P.d == 64) {
    if (drop) return fn(std::integral_constant<int, 64>{}, std::true_type{});
    return fn(std::integral_constant<int, 64>{}, std::false_type{});
  }
  if (drop) return fn(std::integral_constant<int, 128>{}, std::true_type{});
  fn(std::integral_constant<int, 128>{}, std::false_type{});
}

}  // namespace

bool tc_eligible(const Plan& P) {
  return P.qh != nullptr && (P.d == 64 || P.d == 128) && P.slopes == nullptr &&
         P.qpos == nullptr && P.kpos == nullptr && P.kv_index == nullptr && P.start == nullptr &&
         P.pad == nullptr && P.bias == nullptr && P.window_left < 0 &&
         (P.causal || P.window_right < 0) && aligned(P.qh, 16) && aligned(P.kh, 16) &&
         aligned(P.vh, 16) && layout_in_eights(P.ql) && layout_in_eights(P.kl) &&
         layout_in_eights(P.vl);
}

void tc_fwd(const char* op, const Plan& P, float* out, float* lse) {
  MG_CHECK(aligned(out, 16), op, ": out is not 16-byte aligned");
  const int64_t qtiles = (P.sq + kTile - 1) / kTile;
  if (P.b * P.n * qtiles == 0) return;
  with_tc_kernel(P, [&]<int D, bool DROP>(std::integral_constant<int, D>,
                                          std::integral_constant<bool, DROP>) {
    const size_t bytes = size_t(4 * kTile * (D + 8)) * sizeof(bf16);  // K, V double-buffered
    const auto kernel = tc_fwd_kernel<D, DROP>;
    allow_shared(op, kernel, bytes);
    kernel<<<block_count(op, P.b * P.n * qtiles), kTcThreads, bytes, detail::stream()>>>(
        P, out, lse, qtiles);
  });
  MG_CUDA_LAUNCH_CHECK();
}

void tc_bwd(const char* op, const Plan& P, float* dq, float* dk, float* dv, const Tensor& dout,
            const float* out, const float* lse, bool accumulate) {
  for (const void* p : {static_cast<const void*>(dq), static_cast<const void*>(dk),
                        static_cast<const void*>(dv), static_cast<const void*>(dout.raw_data())})
    MG_CHECK(aligned(p, 16), op, ": a gradient operand is not 16-byte aligned");
  const int64_t rows = P.b * P.n * P.sq;
  const Device dev = dout.device();
  // dO rounded to bf16 once (the products round it anyway): half the bytes for the dK, dV
  // kernel, which reads each query tile's dO once per key tile.
  const Tensor dout_h = Tensor::empty(dout.shape(), DType::BF16, dev);
  megatron::cuda::cast(dout_h, dout);
  TcGrads G;
  G.dq = dq;
  G.dk = dk;
  G.dv = dv;
  G.dout = dout.data<float>();
  G.dout_h = static_cast<const bf16*>(dout_h.raw_data());
  G.out = out;
  G.lse = lse;
  G.accumulate = accumulate;
  Tensor delta;
  if (rows > 0) {
    delta = Tensor::empty({rows}, DType::F32, dev);
    G.delta = delta.data<float>();
    launch_delta(P, G.dout, G.out, G.delta);
  }
  const int64_t qtiles = (P.sq + kTile - 1) / kTile, ktiles = (P.skv + kTile - 1) / kTile;
  with_tc_kernel(P, [&]<int D, bool DROP>(std::integral_constant<int, D>,
                                          std::integral_constant<bool, DROP>) {
    if (P.b * P.g * ktiles > 0) {
      // K, V; Q and dO double-buffered; lse and delta double-buffered.
      const size_t bytes = size_t(6 * kTile * (D + 8)) * sizeof(bf16) + 4 * kTile * sizeof(float);
      const auto kernel = tc_dkv_kernel<D, DROP>;
      allow_shared(op, kernel, bytes);
      kernel<<<block_count(op, P.b * P.g * ktiles), kTcThreads, bytes, detail::stream()>>>(
          P, G, ktiles);
      MG_CUDA_LAUNCH_CHECK();
    }
    if (rows > 0) {
      const size_t bytes = size_t(4 * kTile * (D + 8)) * sizeof(bf16);  // double-buffered
      const auto kernel = tc_dq_kernel<D, DROP>;
      allow_shared(op, kernel, bytes);
      kernel<<<block_count(op, P.b * P.n * qtiles), kTcThreads, bytes, detail::stream()>>>(
          P, G, qtiles);
      MG_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace megatron::cuda::attn
