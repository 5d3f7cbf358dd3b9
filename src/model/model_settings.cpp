// The model-settings table and its codecs (model_settings.h).
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

const json* lookup(const json& args, const char* key) {
  if (args.contains(key) && !args.at(key).is_null()) return &args.at(key);
  return nullptr;
}

// Reads Megatron's argument `key` into `field` when recorded; a value of another type is an
// Error naming the argument.
template <class T>
bool take(const json& args, const char* key, T& field) {
  const json* v = lookup(args, key);
  if (!v) return false;
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
  MG_REQUIRE(want == nullptr, "checkpoint args: \"", key, "\" should be ", want, ", got ", v->dump());
  v->get_to(field);
  return true;
}

bool flag_of(const json& args, const char* key) {
  bool on = false;
  take(args, key, on);
  return on;
}

// metadata.json's codec of a row that is the field `f`, under `key`.
template <class T>
ModelSetting with_meta(ModelSetting s, T TransformerConfig::*f) {
  const char* key = s.key;
  s.to_meta = [key, f](const TransformerConfig& c, json& meta) { meta[key] = c.*f; };
  s.from_meta = [key, f](const json& meta, TransformerConfig& c) {
    if (const json* v = lookup(meta, key)) v->get_to(c.*f);
  };
  return s;
}

// A row that is one field: the metadata key, the Megatron argument and the field share a name;
// the first flag (aliases after commas, as CLI11 takes them) sets it.
template <class T>
ModelSetting field(const char* key, SettingEffect effect, std::vector<const char*> flags_,
                   const char* help, T TransformerConfig::*f, std::vector<const char*> choices = {}) {
  ModelSetting row{key, effect, flags_, help, SettingField(f), std::move(choices), {key},
                   [f](const TransformerConfig& c) { return text(c.*f); },
                   [f](TransformerConfig& d, const TransformerConfig& s) { d.*f = s.*f; },
                   [key, f](const TransformerConfig& c, json& out) { out[key] = c.*f; },
                   [key, f](const json& args, TransformerConfig& c) { return take(args, key, c.*f); },
                   flags_.empty() ? std::string() : std::string(flags_.front()), {}, {}, {}};
  return with_meta(std::move(row), f);
}

// A field recorded in metadata.json only (SettingEffect::Recorded): its command binds its flag.
template <class T>
ModelSetting recorded(const char* key, T TransformerConfig::*f, std::vector<const char*> choices = {}) {
  ModelSetting s = field(key, SettingEffect::Recorded, {}, "", f, std::move(choices));
  s.megatron_args = {};
  s.to_megatron = [](const TransformerConfig&, json&) {};
  s.from_megatron = [](const json&, TransformerConfig&) { return false; };
  return s;
}

// A row whose value needs its own words: the shape of field() with hand-written parts.
ModelSetting custom(const char* key, SettingEffect effect, std::vector<const char*> flags,
                    std::vector<const char*> megatron_args,
                    std::function<std::string(const TransformerConfig&)> show,
                    std::function<void(TransformerConfig&, const TransformerConfig&)> copy,
                    std::function<void(const TransformerConfig&, json&)> to,
                    std::function<bool(const json&, TransformerConfig&)> from) {
  return {key,           effect,          std::move(flags), "",       SettingField(),
          {},            std::move(megatron_args), std::move(show), std::move(copy), std::move(to),
          std::move(from), std::string(), {}, {}, {}};
}

template <class Kind>
std::vector<const char*> names_of(std::span<const Kind> kinds) {
  std::vector<const char*> out;
  for (const Kind& k : kinds) out.push_back(k.name);
  return out;
}

constexpr SettingEffect Shape = SettingEffect::Shape, Function = SettingEffect::Function;

}  // namespace

// From the activation table (layer_kinds.h); a name not in it (a newer checkpoint) as it is.
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

namespace {
std::vector<ModelSetting> setting_rows();  // below
}  // namespace

const std::vector<ModelSetting>& model_settings() {
  static const std::vector<ModelSetting> table = [] {
    std::vector<ModelSetting> rows = setting_rows();
    for (ModelSetting& s : rows) s.hf = hf_columns(s.key);
    return rows;
  }();
  return table;
}

namespace {

std::vector<ModelSetting> setting_rows() {
  using TC = TransformerConfig;
  return {
      field("num_layers", Shape, {"--num-layers"}, "Transformer layers", &TC::num_layers),
      field("hidden_size", Shape, {"--hidden-size"}, "Hidden size", &TC::hidden_size),
      field("num_attention_heads", Shape, {"--num-attention-heads"}, "Attention heads",
            &TC::num_attention_heads),
      [] {
        ModelSetting s = field("ffn_hidden_size", Shape, {"--ffn-hidden-size"},
                               "MLP width (default 4 x hidden)", &TC::ffn_hidden_size);
        s.show = [](const TC& c) { return text(c.ffn()); };
        s.to_megatron = [](const TC& c, json& out) { out["ffn_hidden_size"] = c.ffn(); };  // validate_args'
        return s;
      }(),
      [] {
        ModelSetting s = field("kv_channels", Shape, {"--kv-channels"},
                               "Per-head width (default hidden / heads)", &TC::kv_channels);
        s.show = [](const TC& c) {
          return c.num_attention_heads > 0 ? text(c.head_dim()) : text(c.kv_channels);
        };
        s.to_megatron = [](const TC& c, json& out) {  // as validate_args leaves it
          out["kv_channels"] = c.num_attention_heads > 0 ? c.head_dim() : c.kv_channels;
        };
        return s;
      }(),
      // Grouped-query attention only with group_query_attention (Megatron ignores the count
      // otherwise); as many groups as heads is plain multi-head attention.
      with_meta(custom(
          "num_query_groups", Shape, {"--group-query-attention", "--num-query-groups"},
          {"group_query_attention", "num_query_groups"},
          [](const TC& c) {
            return c.query_groups() == c.num_attention_heads
                       ? std::string("none (multi-head attention)")
                       : text(c.query_groups());
          },
          [](TC& d, const TC& s) { d.num_query_groups = s.num_query_groups; },
          [](const TC& c, json& out) {
            out["group_query_attention"] = c.num_query_groups > 0;
            out["num_query_groups"] = c.num_query_groups > 0 ? c.query_groups() : 1;  // argparse's
          },
          [](const json& args, TC& c) {
            const json* gqa = lookup(args, "group_query_attention");
            int groups = 0;
            const bool has_groups = take(args, "num_query_groups", groups);
            if (!gqa && !has_groups) return false;
            const bool on = gqa ? flag_of(args, "group_query_attention") : true;
            c.num_query_groups = on && has_groups ? groups : 0;
            return true;
          }),
          &TC::num_query_groups),
      field("max_position_embeddings", Shape, {"--max-position-embeddings"},
            "Longest sequence the model takes (default --seq-length)",
            &TC::max_position_embeddings),
      field("normalization", Function, {"--normalization"}, "Normalization layer",
            &TC::normalization, names_of(norm_kinds())),
      [] {  // Megatron-LM's current name first; older checkpoints say layernorm_epsilon
        ModelSetting s = field("layernorm_epsilon", Function, {"--norm-epsilon", "--layernorm-epsilon"},
                               "Norm epsilon", &TC::layernorm_epsilon);
        s.option = "--norm-epsilon,--layernorm-epsilon";
        s.megatron_args = {"norm_epsilon", "layernorm_epsilon"};
        s.to_megatron = [](const TC& c, json& out) {
          out["norm_epsilon"] = c.layernorm_epsilon;
          out["layernorm_epsilon"] = c.layernorm_epsilon;
        };
        s.from_megatron = [](const json& args, TC& c) {
          return take(args, "norm_epsilon", c.layernorm_epsilon) ||
                 take(args, "layernorm_epsilon", c.layernorm_epsilon);
        };
        return s;
      }(),
      field("apply_layernorm_1p", Function, {"--apply-layernorm-1p"},
            "Zero-centred norm weight: stored as gamma - 1, computed with weight + 1",
            &TC::apply_layernorm_1p),
      // The activation from Megatron's switches (TransformerConfig::activation).
      with_meta(custom(
          "activation", Function,
          {"--swiglu", "--squared-relu", "--openai-gelu", "--no-bias-gelu-fusion"},
          {"swiglu", "squared_relu", "openai_gelu", "bias_gelu_fusion"},
          [](const TC& c) { return activation_display_name(c.activation); },
          [](TC& d, const TC& s) { d.activation = s.activation; },
          [](const TC& c, json& out) {
            out["swiglu"] = c.activation == activation_kinds()[size_t(ActivationId::swiglu)].name;
            out["squared_relu"] =
                c.activation == activation_kinds()[size_t(ActivationId::squared_relu)].name;
            // Megatron's GeLU: the fused bias-GeLU (on by default) computes the tanh form, so
            // does --openai-gelu; the exact erf form is the unfused F.gelu (or any GeLU without
            // biases). The fusion stays on unless --no-bias-gelu-fusion or --disable-bias-linear
            // turned it off, whatever the activation (validate_args only clears it without biases).
            const bool tanh = c.activation == activation_kinds()[size_t(ActivationId::gelu_tanh)].name;
            const bool erf = c.activation == activation_kinds()[size_t(ActivationId::gelu)].name;
            out["openai_gelu"] = tanh && !c.add_bias_linear;
            out["bias_gelu_fusion"] = !erf && c.add_bias_linear;
          },
          [](const json& args, TC& c) {
            if (!lookup(args, "swiglu") && !lookup(args, "squared_relu") &&
                !lookup(args, "openai_gelu") && !lookup(args, "bias_gelu_fusion"))
              return false;
            // Without biases Megatron has no bias-GeLU fusion.
            const bool fusion = !lookup(args, "bias_gelu_fusion") || flag_of(args, "bias_gelu_fusion");
            bool bias = true;
            take(args, "add_bias_linear", bias);
            c.activation = activation_from_flags(flag_of(args, "swiglu"), flag_of(args, "squared_relu"),
                                                 flag_of(args, "openai_gelu"), fusion, bias);
            return true;
          }),
          &TC::activation),
      [] {
        ModelSetting s = field("position_embedding_type", Function,
                               {"--position-embedding-type", "--no-position-embedding",
                                "--use-rotary-position-embeddings"},
                               "learned_absolute, rope, alibi, none, or relative (T5)",
                               &TC::position_embedding_type, names_of(position_embedding_kinds()));
        s.megatron_args = {"position_embedding_type", "add_position_embedding",
                           "use_rotary_position_embeddings"};
        s.to_megatron = [](const TC& c, json& out) {
          // Megatron has no "none" type: no position embedding is add_position_embedding False.
          out["position_embedding_type"] =
              c.position_embedding_type == "none" ? "learned_absolute" : c.position_embedding_type;
          out["add_position_embedding"] = c.position_embedding_type != "none";
          out["use_rotary_position_embeddings"] = c.rope();
        };
        s.from_megatron = [](const json& args, TC& c) {
          bool recorded = take(args, "position_embedding_type", c.position_embedding_type);
          // The legacy model's PositionEmbeddingType enum (absolute, rotary) by its kind's name.
          if (const PositionEmbeddingKind* k = find_position_embedding_kind(c.position_embedding_type))
            c.position_embedding_type = k->name;
          if (flag_of(args, "use_rotary_position_embeddings")) {
            c.position_embedding_type = "rope";
            recorded = true;
          }
          if (lookup(args, "add_position_embedding") && !flag_of(args, "add_position_embedding") &&
              c.learned_position_embedding()) {
            c.position_embedding_type = "none";
            recorded = true;
          }
          return recorded;
        };
        return s;
      }(),
      field("rotary_percent", Function, {"--rotary-percent"}, "Fraction of each head's dims rotated",
            &TC::rotary_percent),
      field("rotary_base", Function, {"--rotary-base"}, "Rotary base", &TC::rotary_base),
      field("rotary_interleaved", Function, {"--rotary-interleaved"},
            "Rotate interleaved pairs (2i, 2i+1) instead of the two halves", &TC::rotary_interleaved),
      // Fixed by the model family, not by a flag or a Megatron argument.
      [] {
        ModelSetting s = field("attention_mask_type", Function, {}, "", &TC::attention_mask_type,
                               names_of(attention_mask_kinds()));
        s.field = SettingField();
        s.megatron_args = {};
        s.to_megatron = [](const TC&, json&) {};
        s.from_megatron = [](const json&, TC&) { return false; };
        return s;
      }(),
      [] {  // metadata.json keeps the two sides as window_left and window_right
        ModelSetting s = custom(
            "window_size", Function, {"--window-size", "--pre-tockens", "--next-tockens"},
            {"window_size"},
            [](const TC& c) { return text(c.window_left) + " " + text(c.window_right); },
            [](TC& d, const TC& s) {
              d.window_left = s.window_left;
              d.window_right = s.window_right;
            },
            [](const TC& c, json& out) {
              if (c.window_left >= 0 || c.window_right >= 0)
                out["window_size"] = json::array({c.window_left, c.window_right});
              else
                out["window_size"] = nullptr;
            },
            [](const json& args, TC& c) {
              const json* v = lookup(args, "window_size");
              if (!v) return false;
              MG_REQUIRE(v->is_array() && v->size() == 2 && (*v)[0].is_number_integer() &&
                             (*v)[1].is_number_integer(),
                         "checkpoint args: \"window_size\" should be two integers, got ", v->dump());
              c.window_left = (*v)[0].get<int64_t>();
              c.window_right = (*v)[1].get<int64_t>();
              return true;
            });
        s.to_meta = [](const TC& c, json& meta) {
          meta["window_left"] = c.window_left;
          meta["window_right"] = c.window_right;
        };
        s.from_meta = [](const json& meta, TC& c) {
          if (const json* v = lookup(meta, "window_left")) v->get_to(c.window_left);
          if (const json* v = lookup(meta, "window_right")) v->get_to(c.window_right);
        };
        return s;
      }(),
      field("qk_layernorm", Function, {"--qk-layernorm"}, "Normalise each query and key head",
            &TC::qk_layernorm),
      [] {  // --disable-bias-linear clears it: the CLI binds the inverted switch itself
        ModelSetting s = field("add_bias_linear", Function, {"--disable-bias-linear"}, "",
                               &TC::add_bias_linear);
        s.field = SettingField();
        return s;
      }(),
      [] {
        ModelSetting s = field("add_qkv_bias", Function, {"--add-qkv-bias", "--disable-bias-linear"},
                               "QKV bias even with --disable-bias-linear", &TC::add_qkv_bias);
        s.show = [](const TC& c) { return text(c.qkv_bias()); };
        // Megatron's add_qkv_bias is the QKV bias itself (validate_args sets it with the biases).
        s.to_megatron = [](const TC& c, json& out) { out["add_qkv_bias"] = c.qkv_bias(); };
        return s;
      }(),
      field("untie_embeddings_and_output_weights", Function,
            {"--untie-embeddings-and-output-weights"},
            "Separate output layer instead of the word embedding",
            &TC::untie_embeddings_and_output_weights),
      // ---- T5 (pretrain-t5)
      [] {
        ModelSetting s = field("decoder_num_layers", Shape, {"--decoder-num-layers"},
                               "T5: decoder layers (default: the encoder's)",
                               &TC::decoder_num_layers);  // 0 is Megatron's None
        s.show = [](const TC& c) { return text(c.decoder_layers()); };
        s.to_megatron = [](const TC& c, json& out) {
          out["decoder_num_layers"] = c.decoder_num_layers > 0 ? json(c.decoder_num_layers) : json();
        };
        return s;
      }(),
      field("relative_attention_num_buckets", Function, {"--relative-attention-num-buckets"},
            "T5: buckets of the relative position bias (--position-embedding-type relative)",
            &TC::relative_attention_num_buckets),
      field("relative_attention_max_distance", Function, {"--relative-attention-max-distance"},
            "T5: distance from which relative positions share the last bucket",
            &TC::relative_attention_max_distance),
      // ---- recorded with the model, bound to flags by their commands (SettingEffect::Recorded)
      recorded("model_family", &TC::model_family, names_of(model_family_kinds())),
      recorded("bert_binary_head", &TC::bert_binary_head),
      recorded("seq_length", &TC::seq_length),
      recorded("decoder_seq_length", &TC::decoder_seq_length),
      recorded("padded_vocab_size", &TC::padded_vocab_size),
      recorded("hidden_dropout", &TC::hidden_dropout),
      recorded("attention_dropout", &TC::attention_dropout),
      recorded("init_method_std", &TC::init_method_std),
      recorded("apply_query_key_layer_scaling", &TC::apply_query_key_layer_scaling),
      recorded("recompute_granularity", &TC::recompute_granularity,
               names_of(std::span<const RecomputeGranularityKind>(kRecomputeGranularityKinds))),
      recorded("recompute_method", &TC::recompute_method,
               names_of(std::span<const RecomputeMethodKind>(kRecomputeMethodKinds))),
      recorded("recompute_num_layers", &TC::recompute_num_layers),
      recorded("sequence_parallel", &TC::sequence_parallel),
      recorded("cp_comm_type", &TC::cp_comm_type, names_of(cp_comm_type_kinds())),
      [] {  // metadata.json's name of the dtype
        ModelSetting s = recorded("params_dtype", &TC::num_layers);
        s.field = SettingField();
        s.show = [](const TC& c) { return std::string(dtype_name(c.params_dtype)); };
        s.copy = [](TC& d, const TC& src) { d.params_dtype = src.params_dtype; };
        s.to_meta = [](const TC& c, json& meta) { meta["params_dtype"] = dtype_name(c.params_dtype); };
        s.from_meta = [](const json& meta, TC& c) {
          const json* v = lookup(meta, "params_dtype");
          if (!v) return;
          const std::string d = v->get<std::string>();
          MG_REQUIRE(d == "bfloat16" || d == "float16" || d == "float32", "checkpoint args: unknown "
                     "params_dtype '", d, "'");
          c.params_dtype = d == "bfloat16" ? DType::BF16 : d == "float16" ? DType::F16 : DType::F32;
        };
        return s;
      }(),
      // the mixture-of-experts block (model/moe/), in transformer_config.h's order
      recorded("num_moe_experts", &TC::num_moe_experts),
      recorded("moe_layer_freq", &TC::moe_layer_freq),
      recorded("moe_ffn_hidden_size", &TC::moe_ffn_hidden_size),
      recorded("moe_router_topk", &TC::moe_router_topk),
      recorded("moe_router_score_function", &TC::moe_router_score_function),
      recorded("moe_router_pre_softmax", &TC::moe_router_pre_softmax),
      recorded("moe_router_topk_scaling_factor", &TC::moe_router_topk_scaling_factor),
      recorded("moe_router_num_groups", &TC::moe_router_num_groups),
      recorded("moe_router_group_topk", &TC::moe_router_group_topk),
      recorded("moe_router_enable_expert_bias", &TC::moe_router_enable_expert_bias),
      recorded("moe_router_bias_update_rate", &TC::moe_router_bias_update_rate),
      recorded("moe_router_force_load_balancing", &TC::moe_router_force_load_balancing),
      recorded("moe_router_load_balancing_type", &TC::moe_router_load_balancing_type),
      recorded("moe_aux_loss_coeff", &TC::moe_aux_loss_coeff),
      recorded("moe_z_loss_coeff", &TC::moe_z_loss_coeff),
      recorded("moe_expert_capacity_factor", &TC::moe_expert_capacity_factor),
      recorded("moe_token_drop_policy", &TC::moe_token_drop_policy),
      recorded("moe_pad_expert_input_to_capacity", &TC::moe_pad_expert_input_to_capacity),
      recorded("moe_shared_expert_intermediate_size", &TC::moe_shared_expert_intermediate_size),
      recorded("moe_shared_expert_gate", &TC::moe_shared_expert_gate),
      recorded("moe_grouped_gemm", &TC::moe_grouped_gemm),
      recorded("moe_token_dispatcher_type", &TC::moe_token_dispatcher_type),
  };
}

}  // namespace

const ModelSetting* find_model_setting(const std::string& key) {
  for (const ModelSetting& s : model_settings())
    if (key == s.key) return &s;
  return nullptr;
}

std::string setting_flags_text(const ModelSetting& s) {
  std::string flag;
  for (const char* f : s.flags) flag += (flag.empty() ? "" : " / ") + std::string(f);
  return flag.empty() ? std::string(s.key) : flag;  // fixed by the model type, not by a flag
}

json megatron_model_args(const TransformerConfig& c) {
  json out = json::object();
  for (const ModelSetting& s : model_settings()) s.to_megatron(c, out);
  return out;
}

RecordedConfig config_from_checkpoint_args(const json& args) {
  RecordedConfig out;
  TransformerConfig& c = out.config;
  if (args.contains("model") && args.at("model").is_object()) {  // ours
    const json& m = args.at("model");
    try {
      from_json(m, c);
    } catch (const json::exception& e) {
      MG_THROW("checkpoint args: malformed \"model\": ", e.what());
    }
    for (const ModelSetting& s : model_settings())
      if (m.contains(s.key)) out.recorded.insert(s.key);
    if (m.contains("gelu_tanh")) out.recorded.insert("activation");  // from_json reads the legacy forms
    if (m.contains("window_left") || m.contains("window_right")) out.recorded.insert("window_size");
    return out;
  }
  // Megatron-LM's flat arguments, row by row (a row may read what an earlier one set).
  try {
    for (const ModelSetting& s : model_settings())
      if (s.from_megatron(args, c)) out.recorded.insert(s.key);
    take(args, "seq_length", c.seq_length);  // the training length, not a setting of the weights
  } catch (const json::exception& e) {
    MG_THROW("checkpoint args: a model argument has the wrong type: ", e.what());
  }
  return out;
}

}  // namespace megatron::model
