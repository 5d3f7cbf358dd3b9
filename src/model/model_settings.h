// The settings that define what a model computes, as one table (every field of
// TransformerConfig that changes the function, with the Megatron flags that set it), and the
// reading of a checkpoint's recorded arguments into a TransformerConfig. Commands that load a
// checkpoint (generate, serve, --use-checkpoint-args) take or check each recorded setting through
// this table, so a setting is honoured or refused with an error naming it, never ignored; a new
// setting is one row here.
//
// Checkpoint arguments come in two forms: ours (metadata.json "args" with the model in "model",
// TransformerConfig's field names) and Megatron-LM's flat argument namespace (swiglu,
// bias_gelu_fusion, norm_epsilon, group_query_attention, ...).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/transformer_config.h"

namespace megatron::model {

struct ModelSetting {
  const char* key;                  // TransformerConfig's field (or derived name)
  std::vector<const char*> flags;   // the flags that choose it (any given: chosen on purpose)
  // The resolved value as text ("0 means default" sizes resolved; floats to 6 digits): two
  // configurations compute alike in this setting iff the texts are equal.
  std::function<std::string(const TransformerConfig&)> show;
  std::function<void(TransformerConfig& dst, const TransformerConfig& src)> copy;
};

// "GeLU (tanh form)", "SwiGLU", ... for TransformerConfig::activation.
std::string activation_display_name(const std::string& activation);
// The Megatron flag that selects `activation` ("--openai-gelu", "--no-bias-gelu-fusion", ...).
std::string activation_flag(const std::string& activation);

// Every setting; the shape ones first.
const std::vector<ModelSetting>& model_settings();

struct RecordedConfig {
  TransformerConfig config;       // defaults where nothing was recorded
  std::set<std::string> recorded;  // ModelSetting::key of every recorded setting
};
// A checkpoint's "args" object in either form.
RecordedConfig config_from_checkpoint_args(const nlohmann::json& args);

}  // namespace megatron::model
