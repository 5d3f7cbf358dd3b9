// The settings of a model, as one table: every field of TransformerConfig is one row (the
// architecture settings, which define what a model computes, and the Recorded ones a checkpoint
// keeps beside them), and every codec of a setting walks the rows instead of naming fields by hand:
//   - checkpoint metadata: "args"."model" of metadata.json, keyed by the row's `key` (the field's
//     name; TransformerConfig's to_json / from_json walk every row's to_meta / from_meta);
//   - Megatron-LM's flat argument namespace (the "args" of its model_optim_rng.pt files, and a
//     checkpoint's "args" in that form): write_megatron_args / config_from_checkpoint_args, through
//     each row's to_megatron / from_megatron (swiglu, bias_gelu_fusion, norm_epsilon,
//     group_query_attention, window_size, ... are the rows' own business);
//   - the checks: check_checkpoint_args compares the Shape rows, the resume / --use-checkpoint-args
//     / generate checks compare the Function rows, by their `show` text;
//   - the CLI (cli/model_flags.cpp) takes the flags and help of the rows that are one plain field;
//   - Hugging Face config.json (training/hf_checkpoint*.cpp): each row's column per architecture
//     (`hf`: keys, the value the class fixes and its refusal, or where the setting goes instead).
//
// Adding a setting: its field in TransformerConfig (transformer_config.h), then ONE row in
// model_settings() in model_settings.cpp: field("name", effect, {"--flag"}, "help",
// &TransformerConfig::name) when the Megatron argument and the metadata key are the field's name
// and the flag takes one value (or is a switch, for a bool); a hand-written row otherwise; or,
// for a field that is recorded but neither a shape nor the weights' function (a run setting
// whose flag is bound elsewhere), recorded("name", &TransformerConfig::name). tests/model/model_settings_test.cpp walks
// every row through every codec, so a row that does not round-trip fails there.
#pragma once

#include <array>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "model/hf_config.h"
#include "model/transformer_config.h"

namespace megatron::model {

enum class SettingEffect : uint8_t {
  Shape,     // the tensors' shapes: check_checkpoint_args requires the checkpoint's value
  Function,  // what the weights compute: refused when it differs from the checkpoint's, unless
             // --override-checkpoint-model-args
  Recorded,  // kept in metadata.json only: no resume check, no Megatron argument of the table, its
             // flags bound by their command (the family, dropout, recomputation, parallel switches,
             // the mixture-of-experts block)
};

// The field of a row that is one plain field (the CLI binds its flag to it); monostate otherwise.
using SettingField =
    std::variant<std::monostate, int TransformerConfig::*, int64_t TransformerConfig::*,
                 float TransformerConfig::*, double TransformerConfig::*, bool TransformerConfig::*,
                 std::string TransformerConfig::*>;

struct ModelSetting {
  const char* key;                // TransformerConfig's field: the metadata.json key and the name in messages
  SettingEffect effect;
  std::vector<const char*> flags;  // the CLI flags that choose it (any given: chosen on purpose)
  const char* help;                // the help text of flags.front() when `field` is set
  SettingField field;              // set: flags.front() (with its aliases) sets this field directly
  std::vector<const char*> choices;  // the values a string field takes (from its kind table)
  std::vector<const char*> megatron_args;  // its names in Megatron's flat argument namespace
  // The resolved value as text ("0 means default" sizes resolved; floats to 6 digits): two
  // configurations compute alike in this setting iff the texts are equal.
  std::function<std::string(const TransformerConfig&)> show;
  std::function<void(TransformerConfig& dst, const TransformerConfig& src)> copy;
  // Megatron's flat namespace: writes the row's arguments; reads them into the config (false:
  // none recorded). A value of the wrong type is a megatron::Error naming the argument.
  std::function<void(const TransformerConfig&, nlohmann::json& flat)> to_megatron;
  std::function<bool(const nlohmann::json& flat, TransformerConfig&)> from_megatron;
  // With `field`: the CLI option that sets it, aliases after commas (flags.front() by default).
  std::string option = {};
  // metadata.json "args"."model": writes the row's keys; reads those present (absent or null: the
  // field keeps its default). A value of the wrong type is a json exception.
  std::function<void(const TransformerConfig&, nlohmann::json& meta)> to_meta = {};
  std::function<void(const nlohmann::json& meta, TransformerConfig&)> from_meta = {};
  // Hugging Face config.json, per architecture (HfArch order; hf_config.h): the keys the setting
  // maps to, the value the class fixes, or where it goes instead (model_settings_hf.cpp).
  std::array<HfMapping, kHfArchCount> hf = {};
};

// The Hugging Face columns of the row `key` (model_settings_hf.cpp; Unmapped where it says none).
std::array<HfMapping, kHfArchCount> hf_columns(const std::string& key);

// "GeLU (tanh form)", "SwiGLU", ... for TransformerConfig::activation.
std::string activation_display_name(const std::string& activation);
// The Megatron flag that selects `activation` ("--openai-gelu", "--no-bias-gelu-fusion", ...).
std::string activation_flag(const std::string& activation);

// Every setting; the shape ones first.
const std::vector<ModelSetting>& model_settings();
// The row named `key`; nullptr when there is none.
const ModelSetting* find_model_setting(const std::string& key);
// The flags of a row for messages: "--a / --b", or its key when the model type fixes it.
std::string setting_flags_text(const ModelSetting& s);

// Megatron's flat arguments of every row for `c` (what a model_optim_rng.pt records).
nlohmann::json megatron_model_args(const TransformerConfig& c);

struct RecordedConfig {
  TransformerConfig config;       // defaults where nothing was recorded
  std::set<std::string> recorded;  // ModelSetting::key of every recorded setting
};
// A checkpoint's "args" object in either form: ours (the model in "model", keyed by the rows'
// keys) or Megatron-LM's flat namespace (the rows' megatron_args, and "seq_length").
RecordedConfig config_from_checkpoint_args(const nlohmann::json& args);

}  // namespace megatron::model
