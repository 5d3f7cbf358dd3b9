// The resident set from /proc/self/status (host_memory.h); the allocator's counters are kept by
// the host allocator itself (core/tensor.cpp).
#include "core/host_memory.h"

#include <cstdio>

namespace megatron {

ResidentMemory resident_memory() {
  ResidentMemory r;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return r;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) r.current = size_t(kb) * 1024;
    if (std::sscanf(line, "VmHWM: %llu kB", &kb) == 1) r.peak = size_t(kb) * 1024;
  }
  std::fclose(f);
  return r;
}

}  // namespace megatron
