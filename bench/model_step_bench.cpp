// Times one GPTModel::forward_backward (fp32, CPU) of the reference configuration
// (6 layers, h=384, 6 heads, seq 256, vocab 50304, micro-batch 4, dropout 0.1) and prints
// ms per step and tokens per second. Flags: --layers --hidden --heads --seq --vocab --mbs --iters
// --recompute {none,selective,full}. Compare with bench/reference/model_step_bench.py (PyTorch).
// The OpenBLAS kernel family (env OPENBLAS_CORETYPE, e.g. Haswell or SkylakeX) is printed.
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/gpt_model.h"

using namespace megatron;

int main(int argc, char** argv) {
  megatron::tune_host_allocator();
  model::TransformerConfig c;
  c.num_layers = 6;
  c.hidden_size = 384;
  c.num_attention_heads = 6;
  c.seq_length = 256;
  c.max_position_embeddings = 256;
  c.padded_vocab_size = 50304;
  int mbs = 4, iters = 5;
  std::string recompute = "none";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--layers") c.num_layers = v;
    else if (k == "--hidden") c.hidden_size = v;
    else if (k == "--heads") c.num_attention_heads = v;
    else if (k == "--seq") c.seq_length = c.max_position_embeddings = v;
    else if (k == "--vocab") c.padded_vocab_size = v;
    else if (k == "--mbs") mbs = v;
    else if (k == "--iters") iters = v;
    else if (k == "--recompute") recompute = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (recompute == "selective") c.recompute_granularity = "selective";
  if (recompute == "full") {
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.recompute_num_layers = 1;
  }
  model::GPTModel m(c, 1234);
  const int64_t s = c.seq_length, n = mbs * s;
  std::vector<int32_t> tok(static_cast<size_t>(n)), lab(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
  Philox rng(1, 2);
  for (int64_t i = 0; i < n; ++i) {
    tok[size_t(i)] = int32_t(rng.u32(uint64_t(2 * i)) % uint32_t(c.padded_vocab_size));
    lab[size_t(i)] = int32_t(rng.u32(uint64_t(2 * i + 1)) % uint32_t(c.padded_vocab_size));
    pos[size_t(i)] = int32_t(i % s);
  }
  model::Batch in;
  in.tokens = Tensor::from_vector(tok, {mbs, s});
  in.labels = Tensor::from_vector(lab, {mbs, s});
  in.position_ids = Tensor::from_vector(pos, {mbs, s});
  in.loss_mask = Tensor::full({mbs, s}, 1.0, DType::F32);
  m.forward_backward(in, 1.0f / float(n), 0);  // warm-up
  double best = 1e30, total = 0, cpu_total = 0;
  model::LossResult r;
  for (int it = 0; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();  // process CPU time: robust to other load
    r = m.forward_backward(in, 1.0f / float(n), uint64_t(it + 1));
    cpu_total += 1000.0 * double(std::clock() - c0) / CLOCKS_PER_SEC;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ms);
    total += ms;
  }
  const double mean = total / iters;
  std::printf(
      "megatron.cpp forward_backward: layers=%d h=%d heads=%d seq=%lld vocab=%lld mbs=%d "
      "recompute=%s threads=%d blas=%s\n  mean %.1f ms  best %.1f ms  %.0f tokens/s (mean)  loss %.4f  "
      "activations %.1f MiB  cpu %.1f ms/step\n",
      c.num_layers, c.hidden_size, c.num_attention_heads, (long long)s,
      (long long)c.padded_vocab_size, mbs, recompute.c_str(), omp_get_max_threads(), openblas_get_corename(),
      mean, best,
      double(n) / (mean / 1000.0), r.loss_sum / r.num_tokens,
      double(m.activation_bytes()) / (1 << 20), cpu_total / iters);
  return 0;
}
