// Internal to the Hugging Face columns of the model-settings table (model_settings_hf.cpp, and
// model_settings_hf_moe.cpp for the mixture-of-experts classes): the kinds of mapping a column
// holds, built by small helpers.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/hf_config.h"
#include "model/transformer_config.h"

namespace megatron::model::hf_table {

using TC = TransformerConfig;
using ojson = nlohmann::ordered_json;
using Columns = std::array<HfMapping, kHfArchCount>;

// No counterpart, no effect on the exported function: an import takes the default (or `read`).
inline HfMapping dropped(const char* note, std::function<void(const HfConfigFile&, TC&)> read = {}) {
  HfMapping m;
  m.role = HfRole::Dropped;
  m.note = note;
  m.read = std::move(read);
  return m;
}

inline HfMapping weights(const char* note) {
  HfMapping m;
  m.role = HfRole::Weights;
  m.note = note;
  return m;
}

// The value the class fixes: `refuse` names another, `read` sets it (and checks keys that would
// ask for another).
inline HfMapping fixed(std::function<std::string(const TC&)> refuse,
                       std::function<void(const HfConfigFile&, TC&)> read,
                       std::function<void(const TC&, ojson&)> write = {}) {
  HfMapping m;
  m.role = HfRole::Fixed;
  m.refuse = std::move(refuse);
  m.read = std::move(read);
  m.write = std::move(write);
  return m;
}

inline HfMapping key(std::vector<const char*> keys, std::function<void(const TC&, ojson&)> write,
                     std::function<void(const HfConfigFile&, TC&)> read,
                     std::function<std::string(const TC&)> refuse = {}) {
  HfMapping m;
  m.role = HfRole::Key;
  m.keys = std::move(keys);
  m.write = std::move(write);
  m.read = std::move(read);
  m.refuse = std::move(refuse);
  return m;
}

// A required positive integer (or its fallback when absent).
inline HfMapping int_key(const char* k, int TC::*f, std::optional<int64_t> fallback = std::nullopt) {
  return key({k}, [k, f](const TC& c, ojson& j) { j[k] = c.*f; },
             [k, f, fallback](const HfConfigFile& h, TC& c) { c.*f = int(h.integer(k, fallback)); });
}

// A float written by its shortest text; `kind`: 'p' positive (and a positive float), 'f' a
// fraction in [0, 1), 'n' any finite number.
inline HfMapping float_key(std::vector<const char*> keys, float TC::*f, double fallback, char kind) {
  const char* k = keys.front();
  return key(std::move(keys),
             [f, k](const TC& c, ojson& j) { j[k] = short_float(c.*f); },
             [k, f, fallback, kind](const HfConfigFile& h, TC& c) {
               c.*f = kind == 'p'   ? h.positive_float(k, fallback)
                      : kind == 'f' ? float(h.fraction(k, fallback))
                                    : float(h.number(k, fallback));
             });
}

// The mixture-of-experts columns (Mixtral, Qwen2-MoE; model_settings_hf_moe.cpp): filled in
// after the dense architectures' columns, from the Llama column where the class agrees with Llama.
void moe_columns(std::map<std::string, Columns>& t);

}  // namespace megatron::model::hf_table
