// The device a layout search plans for: memory per device, peak and attainable FLOP/s, memory
// bandwidth, interconnect bandwidth and collective latency. Named GPUs carry their data-sheet
// figures with the efficiency Megatron-LM reaches on them; `cpu` is this machine, measured: a
// matrix product of a transformer's shape timed with the threads each rank of the world gets
// (this build's own CPU kernels), a large copy for memory bandwidth (and for the shared-memory
// transport MPI uses between local ranks), the memory the kernel reports, and the resident
// memory of this program before any tensor exists. Flags override any figure.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan_config.h"

namespace megatron::plan {

struct DeviceSpec {
  std::string name;                   // "h100", "h200", "cpu", or "custom"
  std::string description;            // one line for the report
  double memory_bytes = 0;            // usable by one rank
  double peak_flops = 0;              // dense, in the training precision, per device
  double efficiency = 0.5;            // fraction of peak_flops a transformer's products reach
  double memory_bandwidth = 0;        // bytes/s (element-wise work, the optimizer step)
  double interconnect_bandwidth = 0;  // bytes/s per device and direction
  double collective_latency = 0;      // seconds per collective call
  double reserved_bytes = 0;          // held outside tensors: runtime, context, process baseline
  bool measured = false;              // the figures were measured on this machine
  // Measured devices: the rate of a matrix product by its FLOPs (ascending): small products run
  // well below the large ones' rate.
  std::vector<std::pair<double, double>> product_rates;
  double achieved_flops() const { return peak_flops * efficiency; }
  // The rate of products of `flops_per_product` FLOPs each (log-interpolated between the
  // measured ones; the achieved rate without measurements).
  double achieved_flops(double flops_per_product) const;
};

struct DeviceOverrides {
  std::optional<double> memory_gib, tflops, interconnect_gbps;  // --device-*, --interconnect-gbps
};

// `name`: h100, h200 or cpu (measured here for `ranks_here` ranks sharing this machine's
// cores). megatron::Error for another name, or a custom device (name "") without --device-tflops
// and --device-memory-gib.
DeviceSpec make_device(const std::string& name, int ranks_here, const DeviceOverrides& overrides,
                       bool bf16);

// This program's resident memory (bytes) once it has the thread pools and matrix-product buffers
// a training process of `in` has: the products of the model's widest shapes run here first (with
// `threads` OpenMP threads, 0: the current number). The part of a training rank's resident set that
// is not tensors.
double process_resident_baseline(const PlanInput& in, int threads = 0);

}  // namespace megatron::plan
