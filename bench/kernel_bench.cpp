// Kernel micro-benchmarks (Google Benchmark) for decoding on the CPU:
//  - one decode step of one layer's attention (hidden 512, 8 heads of 64, 128 or 1024 cached
//    positions): ops::kv_cache_append and the core ops::attention_fwd over the KV cache
//    (HeadLayout::cache, kv_index = each row's slot), as the model runs it, batch 1 and 16 (a slot
//    per sequence), with an fp32 cache (kind 0) or a bf16 cache (a bf16 model's: kind 1 on the
//    CPU's bf16 unit, kind 2 on the forced fp32 unit, which widens the bf16 values);
//  - ops::gemm with one output row (decoding one token: x [1, k] @ W^T) beside the plain
//    single-threaded cblas_sgemv and cblas_sgemm calls on the same operands, for the QKV
//    (512 -> 1536), MLP (512 -> 2048) and output-layer (512 -> 50304) shapes.
// Run: build/bench/kernel_bench [--benchmark_repetitions=3 ...]; OMP_NUM_THREADS sets the
// threads of the ops (OpenBLAS itself runs single-threaded, as in the ops).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/ops.h"

namespace {
using namespace megatron;

Tensor randn(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::empty(shape, DType::F32);
  Philox(7, stream).fill_normal(t.data<float>(), t.numel(), 0.0f, 1.0f);
  return t;
}

constexpr int kHeads = 8, kHeadDim = 64;

Tensor as_bf16(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::BF16);
  ops::cast(out, t);
  return out;
}

// One decode step: each of `batch` sequences (its own slot) has `cached` positions in the cache
// and attends with its new token at position `cached`.
void BM_KvCacheDecode(benchmark::State& state) {
  const int64_t batch = state.range(0), cached = state.range(1), kind = state.range(2);
  const int64_t max_len = cached + 1;
  const int64_t width = int64_t(kHeads) * 3 * kHeadDim;
  ops::AttentionShape sh;
  sh.heads = kHeads;
  sh.groups = kHeads;
  sh.head_dim = kHeadDim;
  sh.softmax_scale = 1.0f / std::sqrt(float(kHeadDim));
  ops::AttentionShape rows = sh;  // one query batch row per sequence, reading its slot
  rows.batch = batch;
  rows.seq = 1;
  rows.kv_seq = rows.q_span = max_len;
  Tensor kc = randn({batch, kHeads, max_len, kHeadDim}, 1);
  Tensor vc = randn({batch, kHeads, max_len, kHeadDim}, 2);
  Tensor qkv = randn({batch, width}, 3);
  if (kind != 0) {
    kc = as_bf16(kc);
    vc = as_bf16(vc);
    qkv = as_bf16(qkv);
    if (kind == 2) ops::cpu::set_bf16_tile_unit(ops::cpu::Bf16Unit::Fp32);
  }
  std::vector<int32_t> slot(static_cast<size_t>(batch)), pos(static_cast<size_t>(batch), int32_t(cached));
  for (int64_t b = 0; b < batch; ++b) slot[size_t(b)] = int32_t(b);
  Tensor ts = Tensor::from_vector(slot, {batch}), tp = Tensor::from_vector(pos, {batch});
  Tensor ctx = Tensor::empty({batch, int64_t(kHeads) * kHeadDim}, DType::F32);
  ops::AttentionInputs in;
  in.q = qkv;
  in.q_layout = ops::HeadLayout::qkv(ops::QkvPart::Query, kHeads, kHeads, kHeadDim, 1);
  in.k = kc;
  in.v = vc;
  in.k_layout = in.v_layout = ops::HeadLayout::cache(kHeads, max_len, kHeadDim);
  in.q_positions = tp;
  in.kv_index = ts;
  for (auto _ : state) {
    ops::kv_cache_append(kc, vc, qkv, ts, tp, sh);
    ops::attention_fwd(ctx, Tensor(), Tensor(), in, ops::AttentionMask{}, rows, ops::DropoutSpec{});
    benchmark::DoNotOptimize(ctx.data<float>());
  }
  ops::cpu::reset_bf16_tile_unit();
  state.counters["tokens/s"] = benchmark::Counter(double(batch), benchmark::Counter::kIsRate);
  state.SetLabel(kind == 0 ? "fp32 cache" : kind == 1 ? "bf16 cache" : "bf16 cache, fp32 unit");
}
BENCHMARK(BM_KvCacheDecode)
    ->ArgsProduct({{1, 16}, {128, 1024}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// y [1, n] = x [1, k] @ W [n, k]^T, three ways.
enum class GemvWay { Ops, Sgemv, Sgemm };
void gemv_bench(benchmark::State& state, GemvWay way) {
  const int64_t k = state.range(0), n = state.range(1);
  Tensor x = randn({1, k}, 4), w = randn({n, k}, 5), y = Tensor::empty({1, n}, DType::F32);
  openblas_set_num_threads(1);  // as the ops keep it
  for (auto _ : state) {
    switch (way) {
      case GemvWay::Ops: ops::gemm(x, false, w, true, y); break;
      case GemvWay::Sgemv:
        cblas_sgemv(CblasRowMajor, CblasNoTrans, int(n), int(k), 1.0f, w.data<float>(), int(k),
                    x.data<float>(), 1, 0.0f, y.data<float>(), 1);
        break;
      case GemvWay::Sgemm:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, int(n), int(k), 1.0f,
                    x.data<float>(), int(k), w.data<float>(), int(k), 0.0f, y.data<float>(), int(n));
        break;
    }
    benchmark::DoNotOptimize(y.data<float>());
  }
  state.counters["GB/s"] = benchmark::Counter(double(n * k * 4), benchmark::Counter::kIsIterationInvariantRate);
}
void BM_GemmOneRow_Ops(benchmark::State& s) { gemv_bench(s, GemvWay::Ops); }
void BM_GemmOneRow_CblasSgemv1T(benchmark::State& s) { gemv_bench(s, GemvWay::Sgemv); }
void BM_GemmOneRow_CblasSgemm1T(benchmark::State& s) { gemv_bench(s, GemvWay::Sgemm); }
#define GEMV_SHAPES ->Args({512, 1536})->Args({512, 2048})->Args({512, 50304})->UseRealTime()->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_GemmOneRow_Ops) GEMV_SHAPES;
BENCHMARK(BM_GemmOneRow_CblasSgemv1T) GEMV_SHAPES;
BENCHMARK(BM_GemmOneRow_CblasSgemm1T) GEMV_SHAPES;

}  // namespace

BENCHMARK_MAIN();
