// Shared helpers of the CPU backend: device/dtype checks that name the op, OpenBLAS kept
// single-threaded (OpenMP is the only thread pool), a vectorisable exp, and the Philox keep-mask
// of one dropout row.
#pragma once

#include <cblas.h>

#include <bit>
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/backend.h"

namespace megatron::ops {
// Work (elements) below which a loop runs on the calling thread: an OpenMP region costs more than
// it saves there (decode steps run one row per sequence) and its idle threads spin while OpenBLAS
// wants the cores. Loops with independent iterations only, so results do not change.
constexpr int64_t kMinParallelWork = 16384;
}  // namespace megatron::ops

namespace megatron::ops::cpu {

// body(i) for i in [0, n): on the OpenMP threads (static schedule) when `work` (elements) exceeds
// kMinParallelWork, else on the calling thread without entering an OpenMP region (even a region
// with one thread costs a futex wake at its barrier: about 75 per decode step of a 6-layer model).
// Iterations must be independent, so the values do not depend on the path.
template <class Body>
inline void parallel_for(int64_t n, int64_t work, Body&& body) {
  if (work > kMinParallelWork) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}
// The same for element-wise loops (simd on both paths).
template <class Body>
inline void parallel_for_simd(int64_t n, Body&& body) {
  if (n > kMinParallelWork) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// The kernel of a kind (op_kinds.h) for the kind-taking ops: calls
// fn.template operator()<Id(i)>() for the i of [0, Count) equal to `kind`, so each kind's loop is
// compiled on its own and the kind is compared once per op call, never inside a loop. An id
// outside [0, Count) throws Error naming the op.
template <size_t Count, class Id, class Fn>
void with_kind(const char* op, Id kind, Fn&& fn) {
  const bool found = [&]<size_t... I>(std::index_sequence<I...>) {
    return ((size_t(kind) == I && (fn.template operator()<Id(I)>(), true)) || ...);
  }(std::make_index_sequence<Count>{});
  if (!found) detail::throw_no_kind_kernel(op, kind, Device::cpu());
}

// The dispatcher hands these kernels tensors of one device whose memory the host can address (the
// CPU, or the checking device with the call's memory opened).
inline void require_host(const char* op, const Tensor& t) {
  MG_CHECK(!t.defined() || t.device().is_host_memory(), op, ": CPU kernel given a tensor on ",
           t.device().to_string());
}
inline void require_f32(const char* op, const char* name, const Tensor& t) {
  require_host(op, t);
  MG_CHECK(t.defined(), op, ": ", name, " is undefined");
  MG_CHECK(t.dtype() == DType::F32, op, ": ", name, " must be float32, got ",
           dtype_name(t.dtype()));
  MG_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}
inline void require_numel(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.numel() == b.numel(), op, ": element counts differ (", shape_str(a.shape()), " vs ",
           shape_str(b.shape()), ")");
}
// A bf16 output of n elements written from fp32 values computed from x (norms, activations):
// contiguous, on the host, and not in x's storage (an fp32 output may alias x; a bf16 one would
// overwrite inputs not yet read).
inline void require_bf16_output(const char* op, const Tensor& out, const Tensor& x, int64_t n) {
  require_host(op, out);
  MG_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  MG_CHECK(out.numel() == n, op, ": out has ", out.numel(), " elements, want ", n);
  MG_CHECK(out.storage() != x.storage(), op, ": a bfloat16 out may not share x's storage");
}
// Rows and columns of a tensor seen as [numel / last, last].
inline int64_t rows_of(const Tensor& t) { return t.numel() / t.size(-1); }

// The CPU backend parallelises with OpenMP only: OpenBLAS is switched to one thread (process
// wide) on first use, and large GEMMs are split across OpenMP threads by the caller.
inline void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// A stored value as fp32 (exact for each storage type).
inline float to_f32(float v) { return v; }
inline float to_f32(bf16 v) { return bf16_to_float(v); }
inline float to_f32(fp16 v) { return fp16_to_float(v); }
// An fp32 value stored as fp32, or rounded to bf16 as ops::cast rounds it (kernels writing either).
inline void put(float* p, float v) { *p = v; }
inline void put(bf16* p, float v) { *p = float_to_bf16(v); }

// exp(x) in float, vectorisable (no calls, no branches): Cody-Waite range reduction x = n ln2 + r
// and the Cephes degree-6 polynomial for exp(r), |r| <= ln2/2; relative error ~2 ulp. Inputs are
// clamped to [-87.3, 88.7], so results underflow to ~1e-38 rather than to denormals or zero.
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float n = float(int32_t(x * 1.44269504088896341f + (x >= 0 ? 0.5f : -0.5f)));
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>(uint32_t(int32_t(n) + 127) << 23);
}

// keep[j] = scale (1/(1-p)) if element (first + j) of the stream is kept, else 0.
inline void dropout_row(float* keep, int64_t n, uint64_t first, const Philox& rng, float p) {
  const float s = 1.0f / (1.0f - p);
  int64_t j = 0;
  while (j < n) {
    uint64_t k = first + uint64_t(j);
    Philox4 blk = rng.block(k >> 2);
    for (uint64_t w = k & 3; w < 4 && j < n; ++w, ++j) {
      float u = float(blk[w] >> 8) * (1.0f / 16777216.0f);
      keep[j] = u >= p ? s : 0.0f;
    }
  }
}

}  // namespace megatron::ops::cpu
