// --device: where a command's model lives. Plain C++ (no CUDA headers); built in every
// configuration, the CUDA parts only with the CUDA backend (MEGATRON_HAVE_CUDA).
//
// "cuda": this process's GPU, chosen by its local rank as Megatron does (torch.cuda.set_device(
// local_rank)): LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID, else
// the world rank modulo the visible GPUs; the CUDA backend is initialised on it. An Error says why
// when the build has no CUDA backend, no GPU is visible, or the local rank has no GPU of its own.
// "cpu": the CPU. "" (the flag not given): a GPU when this build has CUDA and one is visible, else
// the CPU.
#pragma once

#include <cstddef>
#include <string>

#include "core/tensor.h"

namespace megatron::cuda {

bool compiled();  // this build has the CUDA backend

// The device for --device `flag` ("cuda", "cpu" or ""), initialised; world_rank is the fallback
// for the local rank.
Device select_device(const std::string& flag, int world_rank);

// "cuda:0 (NVIDIA H100 80GB HBM3)", or "cpu": for the start-up log.
std::string describe_device(Device device);

// Megatron's report_memory line, "[Rank R] NAME memory (MB) | allocated: A | max allocated: MA |
// reserved: R | max reserved: MR", MiB printed as Python prints a float (the shortest
// round-trip form, "0.0", "1536.5"), from the caching allocator's counters of `device` (zeros for
// the CPU). The trainer prints it once, after the first logged interval, on the ranks whose
// data-parallel rank is 0, as Megatron's training_log does.
struct MemoryCounters {
  size_t allocated = 0, max_allocated = 0, reserved = 0, max_reserved = 0;  // bytes
};
std::string memory_report_line(const std::string& name, int world_rank, const MemoryCounters& c);
std::string memory_report(const std::string& name, int world_rank, Device device);
std::string python_float(double x);

// This process's local rank from the launcher's environment, or -1 when none is set.
int local_rank_from_env();

}  // namespace megatron::cuda
