// What `megatron plan` prints: the run's layout, Megatron's theoretical memory report in
// Megatron's words, this build's prediction per pipeline stage beside it, the layout search's
// table and the measurement against the prediction; as text, or as one JSON object (--json)
// whose numbers are the raw doubles (bytes, seconds) for scripts and tests.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/device.h"
#include "plan/layout_search.h"
#include "plan/measure.h"
#include "plan/megatron_memory.h"
#include "plan/memory_model.h"
#include "plan/plan_config.h"
#include "plan/time_model.h"

namespace megatron::plan {

struct PlanResult {
  PlanInput input;
  MegatronMemoryReport megatron;
  MemoryPrediction prediction;
  double process_resident = 0;  // bytes this program holds without tensors (measured here)
  std::optional<DeviceSpec> device;
  std::optional<StepTime> time;             // with a device
  std::vector<Candidate> search;            // --search, ranked
  std::optional<Measurement> measurement;   // --measure
  std::optional<PlanInput> measured_input;  // the layout --measure ran
  std::optional<MemoryPrediction> measured_prediction;
  std::optional<StepTime> measured_time;  // its predicted time on this machine's CPU
};

std::string plan_text(const PlanResult& r, size_t search_rows);
nlohmann::json plan_json(const PlanResult& r);

}  // namespace megatron::plan
