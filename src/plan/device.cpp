// Named and measured devices (device.h).
#include "plan/device.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/transformer_config.h"

namespace megatron::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// FLOP/s of this build's CPU matrix product of [n, n] x [n, n]^T (fp32) with `threads` OpenMP
// threads: the best of a few timed runs.
double measure_gemm_flops(int threads, int64_t n_side = 1024) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const int64_t m = n_side, k = n_side, n = n_side;
  Tensor a = Tensor::zeros({m, k}, DType::F32), b = Tensor::zeros({n, k}, DType::F32);
  Tensor c = Tensor::zeros({m, n}, DType::F32);
  a.fill_(0.5);
  b.fill_(0.25);
  ops::gemm(a, false, b, true, c);  // warm-up: threads, BLAS buffers
  double best = 0;
  const auto t_all = Clock::now();
  for (int i = 0; i < 20 && (i < 3 || seconds_since(t_all) < 0.4); ++i) {
    const auto t0 = Clock::now();
    ops::gemm(a, false, b, true, c);
    const double s = seconds_since(t0);
    if (s > 0) best = std::max(best, 2.0 * double(m * n * k) / s);
  }
  omp_set_num_threads(saved);
  return best;
}

// Bytes/s of a large copy (read + write counted once each).
double measure_copy_bandwidth() {
  const size_t bytes = size_t(64) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double s = seconds_since(t0);
    if (s > 0) best = std::max(best, 2.0 * double(bytes) / s);
  }
  return best;
}

// Seconds for one hand-off between two threads spinning on a shared word (yielding while they
// wait): what a shared-memory transport between two ranks pays at least per message. On a busy
// machine the other thread must first be scheduled, and this shows it.
double measure_handoff_latency() {
  std::atomic<int> turn{0};
  constexpr int kRounds = 500;
  std::thread other([&] {
    for (int i = 0; i < kRounds; ++i) {
      while (turn.load(std::memory_order_acquire) != 1) std::this_thread::yield();
      turn.store(0, std::memory_order_release);
    }
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < kRounds; ++i) {
    turn.store(1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }
  const double s = seconds_since(t0);
  other.join();
  return s / (2.0 * kRounds);
}

double host_memory_total() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  double total = 0;
  if (f) {
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemTotal: %llu kB", &kb) == 1) total = double(kb) * 1024.0;
    std::fclose(f);
  }
  return total;
}

DeviceSpec gpu(const std::string& name, double memory_mib, double bandwidth, bool half) {
  DeviceSpec d;
  d.name = name;
  d.memory_bytes = memory_mib * kMiB;
  // Dense bf16/fp16 tensor-core peak (SXM), or TF32 for an fp32 run.
  d.peak_flops = half ? 989.4e12 : 494.7e12;
  d.efficiency = 0.45;  // what Megatron-LM's GPT runs typically reach (MFU)
  d.memory_bandwidth = bandwidth;
  d.interconnect_bandwidth = 450e9;  // NVLink 4, per direction
  d.collective_latency = 20e-6;
  d.reserved_bytes = 1.5 * kGiB;  // CUDA context, cuBLAS workspaces, NCCL buffers
  return d;
}

}  // namespace

double DeviceSpec::achieved_flops(double flops) const {
  if (product_rates.empty()) return achieved_flops();
  if (flops <= product_rates.front().first) return product_rates.front().second;
  for (size_t i = 1; i < product_rates.size(); ++i)
    if (flops <= product_rates[i].first) {
      const auto& [f0, r0] = product_rates[i - 1];
      const auto& [f1, r1] = product_rates[i];
      const double t = std::log(flops / f0) / std::log(f1 / f0);
      return r0 + t * (r1 - r0);
    }
  return product_rates.back().second;
}

double process_resident_baseline(const PlanInput& in, int threads) {
  const int saved = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  const model::TransformerConfig& m = in.args.model;
  // Few rows, the model's widths (capped: beyond the products' blocking nothing more is touched):
  // the product buffers fill as training's do, in milliseconds.
  const int64_t h = std::min<int64_t>(m.hidden_size, 512);
  const int64_t wide =
      std::min<int64_t>(std::max<int64_t>(m.padded_vocab_size / in.layout.tp, m.ffn()), 16384);
  for (const int64_t n : {wide, std::min<int64_t>(int64_t(m.ffn()) * 2 / in.layout.tp, 16384)}) {
    Tensor a = Tensor::zeros({16, h}, DType::F32), b = Tensor::zeros({n, h}, DType::F32);
    Tensor c = Tensor::zeros({16, n}, DType::F32), d = Tensor::zeros({n, h}, DType::F32);
    ops::gemm(a, false, b, true, c);   // forward
    ops::gemm(c, false, b, false, a);  // input gradient
    ops::gemm(c, true, a, false, d);   // weight gradient
  }
  omp_set_num_threads(saved);
  return double(resident_memory().current);
}

DeviceSpec make_device(const std::string& name, int ranks_here, const DeviceOverrides& o,
                       bool bf16) {
  DeviceSpec d;
  if (name == "h100") {
    d = gpu("h100", 81559, 3.35e12, bf16);
    d.description = "NVIDIA H100 SXM (data sheet)";
  } else if (name == "h200") {
    d = gpu("h200", 143771, 4.8e12, bf16);
    d.description = "NVIDIA H200 SXM (data sheet)";
  } else if (name == "cpu") {
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    const int ranks = std::max(1, ranks_here);
    const int threads = std::max(1, cores / ranks);
    d.name = "cpu";
    d.measured = true;
    // Oversubscribed ranks share the cores: each gets cores / ranks of one thread's rate.
    const double share = ranks > cores ? double(cores) / double(ranks) : 1.0;
    for (const int64_t side : {128, 256, 512, 1024}) {
      const double f = 2.0 * double(side * side * side);
      d.product_rates.push_back({f, measure_gemm_flops(threads, side) * share});
    }
    // Larger products never run slower (timing noise on a busy machine aside).
    for (size_t i = d.product_rates.size() - 1; i-- > 0;)
      d.product_rates[i].second =
          std::min(d.product_rates[i].second, d.product_rates[i + 1].second);
    d.peak_flops = d.product_rates.back().second;
    d.efficiency = 1.0;  // the measured rate is what the products reach
    const double copy = measure_copy_bandwidth();
    d.memory_bandwidth = copy / double(std::min(ranks, cores));
    d.interconnect_bandwidth =
        copy / 2.0 / double(std::min(ranks, cores));  // shared memory, in and out
    // MPI's own overhead per collective step over the hand-off between two cores.
    d.collective_latency = std::max(30e-6, 4.0 * measure_handoff_latency()) *
                           (ranks > cores ? double(ranks) / double(cores) : 1.0);
    d.memory_bytes = host_memory_total() / double(ranks);
    d.reserved_bytes = double(resident_memory().current);
    d.description = str("this machine's CPU, measured: ", cores, " cores, ", threads,
                        " thread(s) per rank for ", ranks, " rank(s)");
  } else if (name.empty()) {
    MG_REQUIRE(o.tflops && o.memory_gib,
               "a device is needed: --device h100|h200|cpu, or "
               "--device-tflops and --device-memory-gib for another one");
    d.name = "custom";
    d.description = "a device as given by --device-tflops and --device-memory-gib";
    d.efficiency = 0.45;
    d.memory_bandwidth = 2e12;
    d.interconnect_bandwidth = 50e9;
    d.collective_latency = 20e-6;
    d.reserved_bytes = 1.5 * kGiB;
  } else {
    MG_THROW("--device ", name,
             " is not known: use h100, h200 or cpu (measured on this machine), "
             "or describe it with --device-tflops and --device-memory-gib");
  }
  if (o.memory_gib) {
    MG_REQUIRE(*o.memory_gib > 0, "--device-memory-gib must be > 0 (got ", *o.memory_gib, ")");
    d.memory_bytes = *o.memory_gib * kGiB;
  }
  if (o.tflops) {
    MG_REQUIRE(*o.tflops > 0, "--device-tflops must be > 0 (got ", *o.tflops, ")");
    d.peak_flops = *o.tflops * 1e12;
  }
  if (o.interconnect_gbps) {
    MG_REQUIRE(*o.interconnect_gbps > 0, "--interconnect-gbps must be > 0 (got ",
               *o.interconnect_gbps, ")");
    d.interconnect_bandwidth = *o.interconnect_gbps * 1e9 / 8.0;
  }
  return d;
}

}  // namespace megatron::plan
