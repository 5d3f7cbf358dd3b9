// A Communicator decorator that measures how long this rank is held up by communication: the
// time inside each collective's launch and inside wait()/test() of its handle. For a blocking
// collective that is its whole duration; for an overlapped one (a bucket's all-reduce running
// during backward) only the part not hidden behind compute. Groups split from a timed
// communicator are timed into the same CommStats, so wrapping the world before
// ParallelState::create times every tensor-, data- and model-parallel collective.
// The trainer reports it as the communication share of the step time (bench/parallel_cpu.sh).
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"

namespace megatron {

struct CommStats {
  double seconds = 0;  // blocked in communication calls
  int64_t calls = 0;   // collectives launched
  int64_t bytes = 0;   // input bytes of the collectives launched
};

std::shared_ptr<Communicator> make_timed_communicator(std::shared_ptr<Communicator> inner,
                                                      std::shared_ptr<CommStats> stats);

}  // namespace megatron
