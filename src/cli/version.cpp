// `megatron version`: prints the version and the build's capabilities.
#include <cstdio>

#include "cli/command.h"

namespace megatron::cli {
namespace {
CommandRegistrar reg("version", "Print the version and build features", 1000, [](CLI::App& sub) {
  sub.callback([] {
    std::printf("megatron.cpp %s\n", MEGATRON_VERSION);
#ifdef MEGATRON_HAVE_CUDA
    std::printf("cuda: compiled in\n");
#else
    std::printf("cuda: not compiled in\n");
#endif
  });
});
}  // namespace
}  // namespace megatron::cli
