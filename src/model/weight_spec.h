// What is done with weight specs (parameter.h) beyond building weights from them: their record in
// checkpoint metadata (JSON, one object per weight), the specs of a whole model without building
// it at size, and Megatron's initial value of a parameter: the whole single-rank master tensor is
// drawn (or set) and this rank's tensor-parallel slice kept, so the result does not depend on the
// TP size (like --use-cpu-initialization).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/parameter.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

struct TransformerConfig;

// The record of a spec in checkpoint metadata ("weights": {name: record}): every field but the
// name, by its WeightSpec field name, init methods and reductions by name. Reading checks every
// field and names `where` (the file) in errors; absent fields keep their defaults.
nlohmann::json weight_spec_to_json(const WeightSpec& spec);
WeightSpec weight_spec_from_json(const std::string& name, const nlohmann::json& record,
                                 const std::string& where);

// The specs of every weight of the single-rank model `cfg` describes (its family's
// parameters() order), by name. Built from a model of the same structure at the smallest sizes,
// so it costs nothing for a large model: a spec never depends on the sizes.
std::map<std::string, WeightSpec> model_weight_specs(const TransformerConfig& cfg);

struct InitScale {
  float std = 0.02f;      // --init-method-std: InitMethod::normal
  float scaled_std = 0;   // InitMethod::scaled_normal: std / sqrt(2 * num_layers)
  // The scales of a model with `num_layers` layers.
  static InitScale of(float init_method_std, int num_layers);
};

// Draws `p` by its InitMethod: normal ones from Philox(seed, stream) over the whole single-rank
// tensor, in order; zeros and ones need no stream. Then casts this rank's shard into p.value.
void init_parameter(Parameter& p, uint64_t seed, uint64_t stream, const InitScale& scale,
                    const TensorParallel& tp);

}  // namespace megatron::model
