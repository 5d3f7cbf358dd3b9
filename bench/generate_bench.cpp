// Generation speed of the GPT engine: prefill tokens/s (the prompt through the model into the KV
// cache) and decode tokens/s (one token per sequence per step) at batch 1 and 16, per wall second
// and (on the CPU) per CPU second of the process, on the CPU or (--device cuda) a GPU. Compare
// with bench/reference/generate_bench.py (PyTorch with a KV cache, same shapes, CPU) or
// bench/reference/gpt2_gpu_torch.py --mode decode (GPU; scripts/gpu-check.sh):
//   build/bench/generate_bench [--layers 6 --hidden 512 --heads 8 --vocab 50304 --prompt 128
//                               --gen 32] [--arch gpt|llama] [--bf16 1] [--device cpu|cuda]
// --bf16 1 keeps the weights in bf16 (as `megatron generate --bf16`; with --bf16 1 on the PyTorch
// side, its model and KV cache in bf16).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "generate_common.h"
#include "kernels/cuda/device_select.h"

using namespace megatron;
using Clock = std::chrono::steady_clock;

// The process's CPU seconds (user + system, all threads): on a shared machine the time a run
// waits for a core does not count.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int main(int argc, char** argv) {
  megatron::tune_host_allocator();
  const bench::Flags f(argc, argv);
  const int64_t layers = f.get("--layers", 6), hidden = f.get("--hidden", 512),
                heads = f.get("--heads", 8), vocab = f.get("--vocab", 50304),
                prompt = f.get("--prompt", 128), gen = f.get("--gen", 32), reps = f.get("--reps", 3);
  const std::string arch = f.text("--arch", "gpt");
  auto cfg = bench::bench_config(layers, hidden, heads, vocab, prompt + gen, arch);
  if (f.get("--bf16", 0) != 0) cfg.params_dtype = DType::BF16;
  const Device device = cuda::select_device(f.text("--device", "cpu"), 0);
  inference::GPTEngine model(cfg, bench::random_weights(cfg), device);
  std::printf("model: %s on %s, %lld layers, hidden %lld, heads %lld, vocab %lld, %s weights; "
              "prompt %lld, generate %lld\n",
              arch.c_str(), cuda::describe_device(device).c_str(), (long long)layers,
              (long long)hidden, (long long)heads, (long long)vocab, dtype_name(cfg.params_dtype),
              (long long)prompt, (long long)gen);
  std::printf("| batch | prefill tokens/s | decode tokens/s | decode ms/step | prefill tokens per "
              "CPU s | decode tokens per CPU s |\n|---|---|---|---|---|---|\n");
  for (int64_t batch : {int64_t(1), int64_t(16)}) {
    std::vector<int32_t> tokens(size_t(batch * prompt));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919) % size_t(vocab));
    std::vector<int32_t> step(size_t(batch), 42);
    double best_prefill = 1e30, best_decode = 1e30, cpu_prefill = 1e30, cpu_decode = 1e30;
    for (int64_t r = 0; r <= reps; ++r) {  // the first round warms up
      model.start(batch, prompt + gen);
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      model.prefill(tokens, prompt, false);
      const auto t1 = Clock::now();
      const double c1 = cpu_seconds();
      for (int64_t g = 0; g < gen; ++g) model.decode_step(step);
      const auto t2 = Clock::now();
      const double c2 = cpu_seconds();
      if (r == 0) continue;
      best_prefill = std::min(best_prefill, std::chrono::duration<double>(t1 - t0).count());
      best_decode = std::min(best_decode, std::chrono::duration<double>(t2 - t1).count());
      cpu_prefill = std::min(cpu_prefill, c1 - c0);
      cpu_decode = std::min(cpu_decode, c2 - c1);
    }
    std::printf("| %lld | %.0f | %.1f | %.2f | %.0f | %.1f |\n", (long long)batch,
                double(batch * prompt) / best_prefill, double(batch * gen) / best_decode,
                1e3 * best_decode / double(gen), double(batch * prompt) / cpu_prefill,
                double(batch * gen) / cpu_decode);
  }
  return 0;
}
