// Megatron's log lines beside the interval line (metrics.h), which `megatron report` reads back:
//  - the arguments block (megatron/training/arguments.py _print_args, printed at start-up):
//      ------------------------ arguments ------------------------
//        hidden_size ..................................... 1024
//      -------------------- end of arguments ---------------------
//    one line per argument, sorted case-insensitively, the name padded with dots to 48 columns;
//    here the arguments are the run's TrainingArgs by their checkpoint names (nested settings by
//    their own name, or parent.name where two share one);
//  - the memory report (megatron/training/utils.py report_memory), which training_log prints after
//    the first logged iterations on every rank of data-parallel rank 0:
//   [Rank R] (after N iterations) memory (MB) | allocated: A | max allocated: B | reserved: C |
//   max reserved: D
// with the CUDA caching allocator's counters in MiB, each printed as Python prints a float. On
// the host the counters are the host allocator's tensor storage (allocated, max allocated) and
// the process's resident set (reserved: VmRSS, max reserved: VmHWM) (core/host_memory.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/host_memory.h"
#include "training/trainer.h"

namespace megatron::training {

std::string format_memory_report(int world_rank, int64_t iteration, const HostMemoryStats& tensors,
                                 const ResidentMemory& resident);

// The arguments block, one string per line.
std::vector<std::string> format_arguments_block(const TrainingArgs& args);

// Python's repr of a float ("123.0", "0.5", "1e-05", "1.5e+16"): the shortest digits that read
// back exactly, in fixed notation for exponents -4..15 and scientific notation otherwise.
std::string python_float_repr(double v);
// The same for a float32 setting: the shortest digits that read back as that float.
std::string python_float_repr(float v);

}  // namespace megatron::training
