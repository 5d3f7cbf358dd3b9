// A per-op time profile for finding where a step's time goes on a device (a developer's tool, as
// PyTorch's profiler table): with MEGATRON_OP_PROFILE=1 in the environment, every dispatched op
// is timed from its call to the completion of its work (on the CPU and any device without a timer
// the device is synchronised before and after each op, so the step runs slower, but each op's
// share is its own; on CUDA by events on the stream, see DeviceTimer), and at exit the
// process prints one table to stderr: op, calls, total and mean time, share of the time in ops,
// and the wall time outside ops (host work, copies, communication). A region of several ops and
// collectives may have a row of its own (an MoE layer's token dispatch and experts: the ops inside
// count in the region's row). Off (the default), an op pays one predictable branch.
#pragma once

#include <string>

namespace megatron::ops::profile {

bool enabled();  // MEGATRON_OP_PROFILE=1, read once

// Waits for the work queued on a device; a backend with an asynchronous queue registers its own
// (CUDA's init). Called around each op while profiling, unless the backend registers a timer.
void set_device_sync(void (*sync)());

// Timing ops on the device's queue instead of synchronising around each (CUDA's events): the step
// runs as it does unprofiled, each op's row gets the device time between a mark queued before it
// and one queued after it, and "outside ops" becomes the time the device spent waiting for the host.
struct DeviceTimer {
  int (*start)() = nullptr;             // queues a first mark; the id of its pair
  void (*stop)(int id) = nullptr;       // queues the pair's second mark
  double (*seconds)(int id) = nullptr;  // waits for the second mark; seconds between; frees id
};
void set_device_timer(const DeviceTimer& timer);

// Forgets what was measured so far (the first training iteration: allocations, algorithm choice)
// and restarts the wall clock at the next op. Nothing when profiling is off.
void restart();

// Times one op while in scope (when enabled()).
class Scope {
 public:
  explicit Scope(const char* op);
  // An op timed under its own row, e.g. "gemm 8192x768x2304 bf16" (built only when enabled()).
  explicit Scope(std::string label);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin();
  const char* op_;
  std::string label_;
  double start_ = 0.0;
  int mark_ = -1;  // the device timer's id, when one times this op
};

}  // namespace megatron::ops::profile
