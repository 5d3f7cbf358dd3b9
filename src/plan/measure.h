// `megatron plan --measure`: a few training steps of one rank's share of a layout, run in this
// process over a simulated world (simulated_communicator.h) on Megatron's synthetic data, with the
// host allocator's high-water mark, the resident set's and the step time measured, to set against
// the prediction (memory_model.h, time_model.h).
#pragma once

#include <cstdint>

#include "plan/plan_config.h"

namespace megatron::plan {

struct Measurement {
  int world_rank = 0, pp_rank = 0;
  int iterations = 0;
  double seconds_per_iteration = 0;  // the median step after the first
  double peak_allocated = 0;         // bytes: the host allocator's high-water mark
  double peak_resident = 0;          // bytes: VmHWM during the run
  double resident_before = 0;        // bytes: VmRSS before the run (code, libraries, tokenizer)
};

// The world rank of the layout whose pipeline stage is `pp_rank` (its first tensor/data rank).
int first_rank_of_stage(const Layout& layout, int pp_rank);

// Runs `iterations` (>= 2) steps of world rank `world_rank`'s share of `in` and measures them.
Measurement measure_rank(const PlanInput& in, int world_rank, int iterations);

}  // namespace megatron::plan
