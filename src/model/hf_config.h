// What the model-settings table (model_settings.h) says about Hugging Face transformers'
// config.json: the architectures a model exports to and imports from, how one setting reaches one
// architecture (HfMapping: a row's column per architecture), and the typed reader of config.json
// the mappings read with (errors name the file and the key). The export and import
// (training/hf_checkpoint*.cpp) walk the rows; model_settings_hf.cpp holds the columns.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace megatron::model {

struct TransformerConfig;

// The transformers model types (config.json's "model_type") a model maps to.
enum class HfArch : uint8_t { gpt2, llama, megatron_bert, mixtral, qwen2_moe };
inline constexpr const char* kHfArchNames[] = {"gpt2", "llama", "megatron-bert", "mixtral", "qwen2_moe"};
inline constexpr size_t kHfArchCount = 5;
// The transformers classes, for messages.
inline constexpr const char* kHfArchClasses[] = {"GPT2LMHeadModel", "LlamaForCausalLM",
                                                 "MegatronBertForPreTraining", "MixtralForCausalLM",
                                                 "Qwen2MoeForCausalLM"};

// config.json of an import: typed reads; a missing required key, a value of the wrong type or out
// of range is a megatron::Error naming the file (label) and the key.
struct HfConfigFile {
  nlohmann::json j;
  std::string label;

  const nlohmann::json* find(const char* key) const;  // nullptr when absent or null
  // A positive integer up to `max` (read as 64 bits and range-checked, never cut); without a
  // fallback the key is required.
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt,
                  int64_t max = INT32_MAX) const;
  double number(const char* key, double fallback, bool positive = false) const;  // finite
  double fraction(const char* key, double fallback) const;  // in [0, 1) (dropout rates)
  // A positive number that stays positive and finite as a float (a norm's epsilon).
  float positive_float(const char* key, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key, const std::string& fallback) const;
  [[noreturn]] void unsupported(const char* key, const std::string& why) const;
};

// A float as the double of its shortest decimal text (1e-05, not 9.99999974737875e-06), so
// config.json reads as a person wrote it and reads back to the same float.
double short_float(float v);

// How one setting reaches one architecture's config.json.
enum class HfRole : uint8_t {
  Unmapped,  // nothing said yet: an export refuses the model, naming the setting
  Key,       // config.json keys: written by `write`, read back by `read`
  Fixed,     // the class fixes the value: `refuse` names any other, `read` sets the fixed one
  Weights,   // carried by the tensors, not by config.json (`note` says how)
  Dropped,   // no counterpart, and no effect on what the exported model computes (a run setting,
             // or one this architecture does not use): an import takes the default (`note`)
};

struct HfMapping {
  HfRole role = HfRole::Unmapped;
  std::vector<const char*> keys;  // Key: its config.json keys
  std::function<void(const TransformerConfig&, nlohmann::ordered_json&)> write;
  std::function<void(const HfConfigFile&, TransformerConfig&)> read;
  // "" when the configuration's value exports; else "SETTING: why" (the flag and its value).
  std::function<std::string(const TransformerConfig&)> refuse;
  const char* note = "";  // Weights, Dropped: where the setting goes
};

}  // namespace megatron::model
