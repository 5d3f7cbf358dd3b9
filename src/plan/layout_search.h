// The layout search of `megatron plan --search`: every TP x PP x CP x DP split of the world
// (with virtual pipeline stages, micro-batch sizes, recomputation, sequence parallelism and the
// distributed optimizer) that the trainer accepts for the run, its predicted peak memory
// (memory_model.h, the most loaded stage, plus the device's reserve) against the device's memory,
// and its estimated step time (time_model.h); the layouts that fit ranked fastest first (less
// memory breaks ties).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "plan/device.h"
#include "plan/memory_model.h"
#include "plan/plan_config.h"
#include "plan/time_model.h"

namespace megatron::plan {

struct Candidate {
  Layout layout;
  double peak_bytes = 0;  // the most loaded stage's allocator peak plus the device's reserve
  StepTime time;
  bool fits = false;
};

struct SearchOptions {
  // Micro-batch sizes tried: the divisors of the global batch / DP up to this (and the run's own).
  int64_t max_micro_batch_size = 16;
};

// Every layout of in.world_size ranks the trainer accepts for the run (the global batch kept),
// fitting or not, ranked: the ones that fit first, each group by step time.
std::vector<Candidate> search_layouts(const PlanInput& in, const DeviceSpec& device,
                                      const SearchOptions& options = {});

// The ranked table (the first `rows` that fit; the run's own layout marked) and its JSON form.
std::string format_search_table(const std::vector<Candidate>& ranked, const Layout& current,
                                size_t rows);
nlohmann::json candidate_json(const Candidate& c);

}  // namespace megatron::plan
