// The cost of dispatching an op by device (kernels/backend.h): the CPU table's scale and add
// entries are replaced by kernels that do nothing, so that ops::scale / ops::add time only the
// dispatch (find the tensors' device, look up its table, call the entry); the same empty kernels
// called directly are the baseline. For scale, the real CPU kernel on one element (one OpenMP
// thread) is timed too, as the smallest work an op call does. Rounds alternate; best of each.
// Flags: --calls N (per round, default 2000000) --rounds R (default 5).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cpu/cpu_backend.h"

using namespace megatron;

namespace {

// Empty kernels with the ops' signatures, kept out of line so that the direct calls stay calls.
[[gnu::noinline]] void empty_scale(const Tensor& x, float s) { asm volatile("" ::"r"(&x), "r"(s)); }
[[gnu::noinline]] void empty_add(const Tensor& out, const Tensor& a, const Tensor& b) {
  asm volatile("" ::"r"(&out), "r"(&a), "r"(&b));
}

template <typename F>
double ns_per_call(int64_t calls, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / double(calls);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t calls = 2000000;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--calls") calls = std::atoll(argv[i + 1]);
    else if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  omp_set_num_threads(1);
  // One element: the kernels do almost nothing, so the call overhead is what is timed. scale
  // takes one tensor, add three (the dispatcher checks each tensor's device).
  const Tensor x = Tensor::full({1}, 1.0, DType::F32);
  const Tensor a = Tensor::full({1}, 1.0, DType::F32), out = Tensor::zeros({1}, DType::F32);
  ops::OpTable empty = ops::cpu::kOps;
  empty.scale = &empty_scale;
  empty.add = &empty_add;
  double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
  for (int r = 0; r < rounds; ++r) {
    ops::register_backend(DeviceType::CPU, &empty);
    best[0] = std::min(best[0], ns_per_call(calls, [&] { ops::scale(x, 1.0f); }));
    best[2] = std::min(best[2], ns_per_call(calls, [&] { ops::add(out, a, x); }));
    ops::register_backend(DeviceType::CPU, &ops::cpu::kOps);
    best[1] = std::min(best[1], ns_per_call(calls, [&] { empty_scale(x, 1.0f); }));
    best[3] = std::min(best[3], ns_per_call(calls, [&] { empty_add(out, a, x); }));
    best[4] = std::min(best[4], ns_per_call(calls, [&] { ops::scale(x, 1.0f); }));
  }
  std::printf("op dispatch, best of %d rounds of %lld calls (ns per call)\n", rounds,
              (long long)calls);
  std::printf("  scale (1 tensor):  through ops:: %.2f  direct %.2f  dispatch %.2f\n", best[0],
              best[1], best[0] - best[1]);
  std::printf("  add (3 tensors):   through ops:: %.2f  direct %.2f  dispatch %.2f\n", best[2],
              best[3], best[2] - best[3]);
  std::printf("  for scale: the CPU kernel on one element through ops:: %.2f\n", best[4]);
  return 0;
}
