// Memory of this process on the host: the built-in host allocator's tensor storage (counted in
// core/tensor.cpp, where the allocator lives) and the resident set the kernel reports. Megatron's
// report_memory line reads the CUDA caching allocator's counters; on the host these are their
// counterparts (allocated / max allocated: tensor storage; reserved / max reserved: resident set).
#pragma once

#include <cstddef>

namespace megatron {

struct HostMemoryStats {
  size_t allocated = 0;  // bytes of tensor storage held now (as requested, before 64-byte rounding)
  size_t peak = 0;       // the most held at once since the start or the last reset
};
HostMemoryStats host_memory_stats();
void reset_host_memory_peak();  // the peak restarts from what is held now

struct ResidentMemory {
  size_t current = 0;  // VmRSS of /proc/self/status, bytes (0 where unavailable)
  size_t peak = 0;     // VmHWM: the largest resident set since the process started
};
ResidentMemory resident_memory();

}  // namespace megatron
