// The matrix-product ceiling of a training step on this CPU: the products of one micro-batch of a
// GPT (per layer QKV, attention output, fc1, fc2, each as often as there are layers; the output
// layer in its 256-row chunks), each
// forward (x W^T), input gradient (dy W) and weight gradient (dy^T x, accumulated), run alone
// through ops::gemm (oneDNN) in fp32 and with bf16 operands, plus a 1024^3 product; the step's
// products twice: one set of operands for all layers of a shape (*_step_gflops, the operands stay
// in the caches) and each layer with its own (*_step_distinct_gflops, as in a step). Prints one
// JSON object: GFLOP per CPU second (the process's user + system time, all threads: on a shared
// machine the time a run waits for a core does not count) per precision over the step's products
// and for the square product, and the kernels that ran. bench/train_cpu.sh divides a step's
// achieved rate per CPU second by these.
//   build/bench/gemm_rate [--layers 12 --hidden 768 --qkv 2304 --fc1 3072 --ffn 3072
//                          --vocab 50304 --rows 256 --seconds 1]
// (qkv, fc1: the output widths of those layers, 3 hidden and ffn by default; rows: the tokens of
// a micro-batch)
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

using namespace megatron;
using Clock = std::chrono::steady_clock;

namespace {

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name) return std::atoll(argv[i + 1]);
  return fallback;
}

Tensor random(const Shape& s, DType dt, uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::F32);
  Philox(11, stream).fill_normal(t.data<float>(), t.numel(), 0.0f, 1.0f);
  return dt == DType::F32 ? t : t.to(dt);
}

// A linear layer's shape (`rows` input rows), found `count` times in a step.
struct Linear {
  int64_t rows, in, out, count = 1;
};

// GFLOP per CPU second of the products of `layers` (each three times: forward, input and weight
// gradients), repeated for about `seconds` of wall time. `distinct`: each of a layer's `count`
// occurrences multiplies its own operands, as the step's layers do (their weights and gradients
// then come from memory, not from the caches); else one set of operands serves all of them.
double rate(const std::vector<Linear>& layers, DType dt, double seconds, bool distinct = false) {
  struct Operands {
    Tensor x, w, y, dy, dx, dw;
  };
  std::vector<std::vector<Operands>> ops_(layers.size());
  double flops = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Linear& l = layers[i];
    for (int64_t c = 0; c < (distinct ? l.count : 1); ++c) {
      const uint64_t s = 4 * (i + layers.size() * uint64_t(c));
      ops_[i].push_back({random({l.rows, l.in}, dt, s), random({l.out, l.in}, dt, s + 1),
                         Tensor::zeros({l.rows, l.out}, DType::F32),
                         random({l.rows, l.out}, dt, s + 2),
                         Tensor::zeros({l.rows, l.in}, DType::F32),
                         Tensor::zeros({l.out, l.in}, DType::F32)});
    }
    flops += double(l.count) * 3.0 * 2.0 * double(l.rows) * double(l.in) * double(l.out);
  }
  auto round = [&] {
    for (size_t i = 0; i < ops_.size(); ++i)
      for (int64_t c = 0; c < layers[i].count; ++c) {
        const Operands& o = ops_[i][size_t(c) % ops_[i].size()];
        ops::gemm(o.x, false, o.w, true, o.y);
        ops::gemm(o.dy, false, o.w, false, o.dx);
        ops::gemm(o.dy, true, o.x, false, o.dw, 1.0f, 1.0f);
      }
  };
  round();  // primitives created, memory touched
  auto cpu_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  int64_t n = 0;
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  do {
    round();
    ++n;
  } while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds);
  return flops * double(n) / (cpu_seconds() - c0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t h = flag(argc, argv, "--hidden", 768), ffn = flag(argc, argv, "--ffn", 4 * h);
  const int64_t qkv = flag(argc, argv, "--qkv", 3 * h), fc1 = flag(argc, argv, "--fc1", ffn);
  const int64_t vocab = flag(argc, argv, "--vocab", 50304), rows = flag(argc, argv, "--rows", 256);
  const int64_t layers = flag(argc, argv, "--layers", 12);
  const double seconds = double(flag(argc, argv, "--seconds", 1));
  std::vector<Linear> step = {{rows, h, qkv, layers}, {rows, h, h, layers},
                              {rows, h, fc1, layers}, {rows, ffn, h, layers}};
  for (int64_t r0 = 0; r0 < rows; r0 += 256) step.push_back({std::min<int64_t>(256, rows - r0), h, vocab});
  const std::vector<Linear> square = {{1024, 1024, 1024}};
  const auto& k = ops::cpu::cpu_kernel_report();
  const double f32_distinct = rate(step, DType::F32, seconds, true);
  const double bf16_distinct = rate(step, DType::BF16, seconds, true);
  std::printf("{\"fp32_step_distinct_gflops\": %.2f, \"bf16_step_distinct_gflops\": %.2f, ",
              f32_distinct, bf16_distinct);
  std::printf("\"fp32_step_gflops\": %.2f, \"bf16_step_gflops\": %.2f, "
              "\"fp32_square_gflops\": %.2f, \"bf16_square_gflops\": %.2f, "
              "\"fp32_kernel\": \"%s\", \"bf16_kernel\": \"%s\", "
              "\"isa\": \"%s\", \"cpu\": \"%s\", \"flags\": \"%s\", \"openblas\": \"%s%s\"}\n",
              rate(step, DType::F32, seconds), rate(step, DType::BF16, seconds),
              rate(square, DType::F32, seconds), rate(square, DType::BF16, seconds),
              k.matmul.f32.c_str(), k.matmul.bf16.c_str(), k.matmul.onednn_isa.c_str(),
              k.cpu_model.c_str(), k.cpu_flags.c_str(), k.openblas_core.c_str(),
              k.openblas_fallback ? " (fallback)" : "");
  return 0;
}
