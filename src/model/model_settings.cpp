// The model-settings table and the reading of recorded checkpoint arguments (model_settings.h).
#include "model/model_settings.h"

#include <cstdio>
#include <type_traits>

#include "core/error.h"
#include "model/layer_spec.h"

namespace megatron::model {

namespace {

using json = nlohmann::json;

std::string text(int64_t v) { return std::to_string(v); }
std::string text(bool v) { return v ? "true" : "false"; }
std::string text(const std::string& v) { return "'" + v + "'"; }
std::string text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}
std::string text(float v) { return text(double(v)); }
std::string text(int v) { return text(int64_t(v)); }

// A setting that is one field, shown as it is.
template <class T>
ModelSetting field(const char* key, std::vector<const char*> flags, T TransformerConfig::*f) {
  return {key, std::move(flags), [f](const TransformerConfig& c) { return text(c.*f); },
          [f](TransformerConfig& d, const TransformerConfig& s) { d.*f = s.*f; }};
}

const json* lookup(const json& args, const char* key) {
  if (args.contains(key) && !args.at(key).is_null()) return &args.at(key);
  return nullptr;
}

}  // namespace

// From the activation table (layer_spec.h); a name not in it (a newer checkpoint) as it is.
std::string activation_display_name(const std::string& a) {
  for (const ActivationKind& k : activation_kinds())
    if (a == k.name) return k.display;
  return a;
}

std::string activation_flag(const std::string& a) {
  for (const ActivationKind& k : activation_kinds())
    if (a == k.name) return k.asked_by;
  return "--" + a;
}

const std::vector<ModelSetting>& model_settings() {
  static const std::vector<ModelSetting> table = {
      field("num_layers", {"--num-layers"}, &TransformerConfig::num_layers),
      field("hidden_size", {"--hidden-size"}, &TransformerConfig::hidden_size),
      field("num_attention_heads", {"--num-attention-heads"},
            &TransformerConfig::num_attention_heads),
      {"ffn_hidden_size", {"--ffn-hidden-size"},
       [](const TransformerConfig& c) { return text(c.ffn()); },
       [](TransformerConfig& d, const TransformerConfig& s) { d.ffn_hidden_size = s.ffn_hidden_size; }},
      {"kv_channels", {"--kv-channels"},
       [](const TransformerConfig& c) {
         return c.num_attention_heads > 0 ? text(c.head_dim()) : text(c.kv_channels);
       },
       [](TransformerConfig& d, const TransformerConfig& s) { d.kv_channels = s.kv_channels; }},
      {"num_query_groups", {"--group-query-attention", "--num-query-groups"},
       [](const TransformerConfig& c) {
         return c.query_groups() == c.num_attention_heads ? std::string("none (multi-head attention)")
                                                          : text(c.query_groups());
       },
       [](TransformerConfig& d, const TransformerConfig& s) {
         d.num_query_groups = s.num_query_groups;
       }},
      field("max_position_embeddings", {"--max-position-embeddings"},
            &TransformerConfig::max_position_embeddings),
      field("normalization", {"--normalization"}, &TransformerConfig::normalization),
      field("layernorm_epsilon", {"--norm-epsilon", "--layernorm-epsilon"},
            &TransformerConfig::layernorm_epsilon),
      field("apply_layernorm_1p", {"--apply-layernorm-1p"}, &TransformerConfig::apply_layernorm_1p),
      {"activation", {"--swiglu", "--squared-relu", "--openai-gelu", "--no-bias-gelu-fusion"},
       [](const TransformerConfig& c) { return activation_display_name(c.activation); },
       [](TransformerConfig& d, const TransformerConfig& s) { d.activation = s.activation; }},
      field("position_embedding_type",
            {"--position-embedding-type", "--no-position-embedding",
             "--use-rotary-position-embeddings"},
            &TransformerConfig::position_embedding_type),
      field("rotary_percent", {"--rotary-percent"}, &TransformerConfig::rotary_percent),
      field("rotary_base", {"--rotary-base"}, &TransformerConfig::rotary_base),
      field("rotary_interleaved", {"--rotary-interleaved"}, &TransformerConfig::rotary_interleaved),
      field("attention_mask_type", {}, &TransformerConfig::attention_mask_type),
      {"window_size", {"--window-size", "--pre-tockens", "--next-tockens"},
       [](const TransformerConfig& c) { return text(c.window_left) + " " + text(c.window_right); },
       [](TransformerConfig& d, const TransformerConfig& s) {
         d.window_left = s.window_left;
         d.window_right = s.window_right;
       }},
      field("qk_layernorm", {"--qk-layernorm"}, &TransformerConfig::qk_layernorm),
      field("add_bias_linear", {"--disable-bias-linear"}, &TransformerConfig::add_bias_linear),
      {"add_qkv_bias", {"--add-qkv-bias", "--disable-bias-linear"},
       [](const TransformerConfig& c) { return text(c.qkv_bias()); },
       [](TransformerConfig& d, const TransformerConfig& s) { d.add_qkv_bias = s.add_qkv_bias; }},
      field("untie_embeddings_and_output_weights", {"--untie-embeddings-and-output-weights"},
            &TransformerConfig::untie_embeddings_and_output_weights),
      // ---- T5 (pretrain-t5)
      {"decoder_num_layers", {"--decoder-num-layers"},
       [](const TransformerConfig& c) { return text(c.decoder_layers()); },
       [](TransformerConfig& d, const TransformerConfig& s) {
         d.decoder_num_layers = s.decoder_num_layers;
       }},
      field("relative_attention_num_buckets", {"--relative-attention-num-buckets"},
            &TransformerConfig::relative_attention_num_buckets),
      field("relative_attention_max_distance", {"--relative-attention-max-distance"},
            &TransformerConfig::relative_attention_max_distance),
  };
  return table;
}

RecordedConfig config_from_checkpoint_args(const json& args) {
  RecordedConfig out;
  TransformerConfig& c = out.config;
  auto mark = [&](const char* key) { out.recorded.insert(key); };
  if (args.contains("model") && args.at("model").is_object()) {  // ours
    const json& m = args.at("model");
    try {
      from_json(m, c);
    } catch (const json::exception& e) {
      MG_THROW("checkpoint args: malformed \"model\": ", e.what());
    }
    for (const ModelSetting& s : model_settings())
      if (m.contains(s.key)) mark(s.key);
    if (m.contains("gelu_tanh")) mark("activation");  // from_json reads the legacy forms
    if (m.contains("window_left") || m.contains("window_right")) mark("window_size");
    return out;
  }
  // Megatron-LM's flat arguments.
  auto take = [&](const char* key, auto& field) {
    const json* v = lookup(args, key);
    if (!v) return;
    using T = std::decay_t<decltype(field)>;
    const char* want = nullptr;
    if constexpr (std::is_same_v<T, bool>) {
      if (!v->is_boolean()) want = "a boolean";
    } else if constexpr (std::is_integral_v<T>) {
      if (!v->is_number_integer()) want = "an integer";
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v->is_number()) want = "a number";
    } else {
      if (!v->is_string()) want = "a string";
    }
    MG_REQUIRE(want == nullptr, "checkpoint args: \"", key, "\" should be ", want, ", got ",
               v->dump());
    v->get_to(field);
    mark(key);
  };
  try {
    take("num_layers", c.num_layers);
    take("hidden_size", c.hidden_size);
    take("num_attention_heads", c.num_attention_heads);
    take("ffn_hidden_size", c.ffn_hidden_size);
    take("kv_channels", c.kv_channels);
    take("seq_length", c.seq_length);
    take("max_position_embeddings", c.max_position_embeddings);
    take("normalization", c.normalization);
    take("apply_layernorm_1p", c.apply_layernorm_1p);
    take("position_embedding_type", c.position_embedding_type);
    take("rotary_percent", c.rotary_percent);
    take("rotary_base", c.rotary_base);
    take("rotary_interleaved", c.rotary_interleaved);
    take("qk_layernorm", c.qk_layernorm);
    take("add_bias_linear", c.add_bias_linear);
    take("add_qkv_bias", c.add_qkv_bias);
    take("untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights);
    if (const json* v = lookup(args, "norm_epsilon"); v || lookup(args, "layernorm_epsilon")) {
      (v ? *v : *lookup(args, "layernorm_epsilon")).get_to(c.layernorm_epsilon);
      mark("layernorm_epsilon");
    }
    // Grouped-query attention only with group_query_attention (Megatron ignores the count
    // otherwise); as many groups as heads is plain multi-head attention.
    const json* gqa = lookup(args, "group_query_attention");
    const json* groups = lookup(args, "num_query_groups");
    if (gqa || groups) {
      const bool on = gqa ? gqa->get<bool>() : true;
      c.num_query_groups = on && groups ? groups->get<int>() : 0;
      mark("num_query_groups");
    }
    if (const json* v = lookup(args, "use_rotary_position_embeddings"); v && v->get<bool>()) {
      c.position_embedding_type = "rope";
      mark("position_embedding_type");
    }
    if (const json* v = lookup(args, "add_position_embedding");
        v && !v->get<bool>() && c.position_embedding_type == "learned_absolute") {
      c.position_embedding_type = "none";
      mark("position_embedding_type");
    }
    if (const json* v = lookup(args, "window_size"); v && v->is_array() && v->size() == 2) {
      c.window_left = (*v)[0].get<int64_t>();
      c.window_right = (*v)[1].get<int64_t>();
      mark("window_size");
    }
    // The activation from Megatron's switches (TransformerConfig::activation).
    auto flag = [&](const char* key) {
      const json* v = lookup(args, key);
      return v && v->get<bool>();
    };
    if (lookup(args, "swiglu") || lookup(args, "squared_relu") || lookup(args, "openai_gelu") ||
        lookup(args, "bias_gelu_fusion")) {
      const json* fusion = lookup(args, "bias_gelu_fusion");
      c.activation = activation_from_flags(flag("swiglu"), flag("squared_relu"),
                                           flag("openai_gelu"), !fusion || fusion->get<bool>(),
                                           c.add_bias_linear);
      mark("activation");
    }
  } catch (const json::exception& e) {
    MG_THROW("checkpoint args: a model argument has the wrong type: ", e.what());
  }
  return out;
}

}  // namespace megatron::model
