// --device resolution (device_select.h).
#include "kernels/cuda/device_select.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "core/error.h"

#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace megatron::cuda {

#ifdef MEGATRON_HAVE_CUDA
bool compiled() { return true; }
#else
bool compiled() { return false; }
#endif

int local_rank_from_env() {
  for (const char* var :
       {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    MG_REQUIRE(*end == '\0' && r >= 0 && r < (1L << 20), "the environment variable ", var, "='",
               v, "' is not a local rank (a non-negative integer)");
    return int(r);
  }
  return -1;
}

Device select_device(const std::string& flag, int world_rank) {
  MG_REQUIRE(flag.empty() || flag == "cuda" || flag == "cpu", "--device ", flag,
             ": expected cuda or cpu");
  if (flag == "cpu") return Device::cpu();
#ifndef MEGATRON_HAVE_CUDA
  (void)world_rank;
  MG_REQUIRE(flag.empty(), "--device cuda: this build has no CUDA backend (it was configured "
             "without a CUDA compiler; rebuild with nvcc on the PATH and -DMEGATRON_CUDA=ON, or "
             "use --device cpu)");
  return Device::cpu();
#else
  const int count = device_count();
  if (count == 0) {
    MG_REQUIRE(flag.empty(), "--device cuda: no CUDA device is visible on this machine (check "
               "the driver with nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu)");
    return Device::cpu();
  }
  const int env_rank = local_rank_from_env();
  const int local = env_rank >= 0 ? env_rank : world_rank % count;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  MG_REQUIRE(local < count, "--device cuda: this process has local rank ", local, " but only ",
             count, " GPU", count == 1 ? " is" : "s are", " visible",
             visible ? str(" (CUDA_VISIBLE_DEVICES=", visible, ")") : std::string(),
             "; start at most ", count, " rank", count == 1 ? "" : "s",
             " per machine (one GPU each), or use --device cpu");
  init(local);
  return Device::cuda(local);
#endif
}

std::string describe_device(Device device) {
#ifdef MEGATRON_HAVE_CUDA
  if (device.is_cuda()) return str(device.to_string(), " (", device_name(device.index), ")");
#endif
  return device.to_string();
}

std::string python_float(double x) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);  // shortest round trip
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // Python prints 3.0, not 3
  return s;
}

std::string memory_report_line(const std::string& name, int world_rank, const MemoryCounters& c) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return str("[Rank ", world_rank, "] ", name, " memory (MB) | allocated: ",
             python_float(double(c.allocated) / kMiB), " | max allocated: ",
             python_float(double(c.max_allocated) / kMiB), " | reserved: ",
             python_float(double(c.reserved) / kMiB), " | max reserved: ",
             python_float(double(c.max_reserved) / kMiB));
}

std::string memory_report(const std::string& name, int world_rank, Device device) {
  MemoryCounters c;
#ifdef MEGATRON_HAVE_CUDA
  if (device.is_cuda()) {
    const AllocatorStats s = allocator_stats();
    c = {s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes, s.peak_reserved_bytes};
  }
#else
  (void)device;
#endif
  return memory_report_line(name, world_rank, c);
}

}  // namespace megatron::cuda
