// Generation speed of the GPT engine: prefill tokens/s (the prompt through the model into the KV
// cache) and decode tokens/s (one token per sequence per step) at batch 1 and 16, on the CPU or
// (--device cuda) a GPU. Compare with bench/reference/generate_bench.py (PyTorch with a KV cache,
// same shapes, CPU) or bench/reference/gpt2_gpu_torch.py --mode decode (GPU; scripts/gpu-check.sh):
//   build/bench/generate_bench [--layers 6 --hidden 512 --heads 8 --vocab 50304 --prompt 128
//                               --gen 32] [--arch gpt|llama] [--device cpu|cuda]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "generate_common.h"
#include "kernels/cuda/device_select.h"

using namespace megatron;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  megatron::tune_host_allocator();
  const bench::Flags f(argc, argv);
  const int64_t layers = f.get("--layers", 6), hidden = f.get("--hidden", 512),
                heads = f.get("--heads", 8), vocab = f.get("--vocab", 50304),
                prompt = f.get("--prompt", 128), gen = f.get("--gen", 32), reps = f.get("--reps", 3);
  const std::string arch = f.text("--arch", "gpt");
  const auto cfg = bench::bench_config(layers, hidden, heads, vocab, prompt + gen, arch);
  const Device device = cuda::select_device(f.text("--device", "cpu"), 0);
  inference::GPTEngine model(cfg, bench::random_weights(cfg), device);
  std::printf("model: %s on %s, %lld layers, hidden %lld, heads %lld, vocab %lld; prompt %lld, "
              "generate %lld\n",
              arch.c_str(), cuda::describe_device(device).c_str(), (long long)layers,
              (long long)hidden, (long long)heads, (long long)vocab,
              (long long)prompt, (long long)gen);
  std::printf("| batch | prefill tokens/s | decode tokens/s | decode ms/step |\n|---|---|---|---|\n");
  for (int64_t batch : {int64_t(1), int64_t(16)}) {
    std::vector<int32_t> tokens(size_t(batch * prompt));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919) % size_t(vocab));
    std::vector<int32_t> step(size_t(batch), 42);
    double best_prefill = 1e30, best_decode = 1e30;
    for (int64_t r = 0; r <= reps; ++r) {  // the first round warms up
      model.start(batch, prompt + gen);
      const auto t0 = Clock::now();
      model.prefill(tokens, prompt, false);
      const auto t1 = Clock::now();
      for (int64_t g = 0; g < gen; ++g) model.decode_step(step);
      const auto t2 = Clock::now();
      if (r == 0) continue;
      best_prefill = std::min(best_prefill, std::chrono::duration<double>(t1 - t0).count());
      best_decode = std::min(best_decode, std::chrono::duration<double>(t2 - t1).count());
    }
    std::printf("| %lld | %.0f | %.1f | %.2f |\n", (long long)batch,
                double(batch * prompt) / best_prefill, double(batch * gen) / best_decode,
                1e3 * best_decode / double(gen));
  }
  return 0;
}
