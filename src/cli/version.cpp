// `megatron version`: prints the version, the build's capabilities and the CPU kernels this
// machine runs (picked at run time from the CPU's flags: kernels/cpu/cpu_kernels.h).
#include <cstdio>

#include "cli/command.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace megatron::cli {
namespace {
CommandRegistrar reg("version", "Print the version and build features", 1000, [](CLI::App& sub) {
  sub.callback([] {
    std::printf("megatron.cpp %s\n", MEGATRON_VERSION);
#ifdef MEGATRON_HAVE_CUDA
    const int n = cuda::device_count();
    std::printf("cuda: compiled in, %d device%s visible\n", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; ++i) std::printf("  cuda:%d %s\n", i, cuda::device_name(i).c_str());
#else
    std::printf("cuda: not compiled in\n");
#endif
#ifdef MEGATRON_HAVE_MPI
    std::printf("mpi: compiled in\n");
#endif
    for (const std::string& line : ops::cpu::cpu_kernel_lines()) std::printf("%s\n", line.c_str());
  });
});
}  // namespace
}  // namespace megatron::cli
