// The core attention op on the CPU, forward and backward of one causal self-attention on fused
// QKV, timed in this process for each kernel in turn: the fp32 kernel (fp32 QKV), the bf16 kernel
// on the CPU's bf16 unit (bf16 QKV), and the bf16 kernel forced onto its fp32 unit; each with the
// probabilities saved for backward (the training default) and recomputed there (selective
// recompute, flash style). bench/attention_cpu.sh runs it beside PyTorch's attention
// (bench/reference/attention_bench.py) and prints one table.
// Usage: build/bench/attention_bench [--batch 4] [--seq 1024] [--heads 12] [--head-dim 64]
//        [--reps 3] [--kernel fp32|bf16|bf16-fp32-unit]   (OMP_NUM_THREADS sets the threads)
// Prints one line per kernel and mode: name, forward and backward milliseconds (process CPU time
// and wall time, median of reps after a warm-up), and the forward+backward GFLOP per CPU second
// (the causal products' useful work: 2 products forward, 4 backward, plus 1 recomputed).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/ops.h"

namespace {
using namespace megatron;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double wall_seconds() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Times {
  double cpu = 0, wall = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t b = 4, s = 1024;
  int n = 12, d = 64, reps = 3;
  std::string only;  // --kernel fp32|bf16|bf16-fp32-unit: that one only
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--kernel") only = argv[i + 1];
    else if (a == "--batch") b = v;
    else if (a == "--seq") s = v;
    else if (a == "--heads") n = int(v);
    else if (a == "--head-dim") d = int(v);
    else if (a == "--reps") reps = int(v);
    else {
      std::fprintf(stderr, "attention_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int64_t width = int64_t(3) * n * d, ctx_width = int64_t(n) * d;
  Tensor qkv = Tensor::empty({b * s, width}, DType::F32);
  Philox(11, 1).fill_normal(qkv.data<float>(), qkv.numel(), 0.0f, 1.0f);
  Tensor qkv16 = Tensor::empty({b * s, width}, DType::BF16);
  for (int64_t i = 0; i < qkv.numel(); ++i)
    qkv16.data<bf16>()[i] = float_to_bf16(qkv.data<float>()[i]);
  Tensor dout = Tensor::empty({b * s, ctx_width}, DType::F32);
  Philox(11, 2).fill_normal(dout.data<float>(), dout.numel(), 0.0f, 1.0f);
  ops::AttentionShape sh{.batch = b, .seq = s, .heads = n, .groups = n, .head_dim = d,
                         .softmax_scale = 1.0f / std::sqrt(float(d))};
  const double causal_flop = 2.0 * double(b) * n * double(s) * double(s + 1) / 2 * d;  // one product
  std::printf("# attention_bench: batch %ld, seq %ld, %d heads of %d, causal, %d threads, "
              "bf16 unit of this CPU: %s\n",
              long(b), long(s), n, d, omp_get_max_threads(),
              ops::cpu::bf16_unit_name(ops::cpu::bf16_tile_unit()));
  std::printf("# kernel\tprobs\tfwd_cpu_ms\tbwd_cpu_ms\tfwd_wall_ms\tbwd_wall_ms\tGFLOP_per_cpu_s\n");
  struct Kernel {
    const char* name;
    const char* key;
    bool half;
    bool force_fp32;
  };
  for (const Kernel& k : {Kernel{"megatron fp32", "fp32", false, false},
                          Kernel{"megatron bf16", "bf16", true, false},
                          Kernel{"megatron bf16, fp32 unit", "bf16-fp32-unit", true, true}}) {
    if (!only.empty() && only != k.key) continue;
    if (k.force_fp32) ops::cpu::set_bf16_tile_unit(ops::cpu::Bf16Unit::Fp32);
    else ops::cpu::reset_bf16_tile_unit();
    if (k.half && !k.force_fp32 && ops::cpu::bf16_tile_unit() == ops::cpu::Bf16Unit::Fp32)
      continue;  // the same as the forced row on this CPU
    const Tensor& x = k.half ? qkv16 : qkv;
    ops::AttentionInputs in;
    in.q = in.k = in.v = x;
    in.q_layout = ops::HeadLayout::qkv(ops::QkvPart::Query, n, n, d, s);
    in.k_layout = ops::HeadLayout::qkv(ops::QkvPart::Key, n, n, d, s);
    in.v_layout = ops::HeadLayout::qkv(ops::QkvPart::Value, n, n, d, s);
    for (bool save : {true, false}) {
      Tensor out = Tensor::empty({b * s, ctx_width}, DType::F32);
      Tensor lse = Tensor::empty({b, n, s}, DType::F32);
      Tensor probs = save ? Tensor::empty({b, n, s, s}, DType::F32) : Tensor();
      Tensor dqkv = Tensor::empty({b * s, width}, DType::F32);
      std::vector<double> fc, bc, fw, bw;
      for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up
        double c0 = cpu_seconds(), w0 = wall_seconds();
        ops::attention_fwd(out, lse, probs, in, ops::AttentionMask{}, sh, ops::DropoutSpec{});
        double c1 = cpu_seconds(), w1 = wall_seconds();
        ops::attention_bwd({dqkv, dqkv, dqkv, Tensor()}, dout, out, lse, probs, in,
                           ops::AttentionMask{}, sh, ops::DropoutSpec{});
        double c2 = cpu_seconds(), w2 = wall_seconds();
        if (r == 0) continue;
        fc.push_back(c1 - c0);
        bc.push_back(c2 - c1);
        fw.push_back(w1 - w0);
        bw.push_back(w2 - w1);
      }
      const double flop = causal_flop * (save ? 6 : 7);
      const double f = median(fc), g = median(bc);
      std::printf("%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\n", k.name, save ? "saved" : "recomputed",
                  1e3 * f, 1e3 * g, 1e3 * median(fw), 1e3 * median(bw), flop / (f + g) * 1e-9);
      std::fflush(stdout);
    }
  }
  ops::cpu::reset_bf16_tile_unit();
  return 0;
}
