// Every row of the model-settings table (model/model_settings.h) through every codec: the CLI,
// the checkpoint metadata, Megatron's flat arguments, the .pt argument Namespace, and the resume
// checks. A row gets a variant (another value than the base model's) generically from its field,
// or from the list below for the rows Megatron spells with switches; a new row that round-trips
// nowhere fails here.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "cli/model_flags.h"
#include "core/error.h"
#include "core/pickle.h"
#include "model/layer_spec.h"
#include "model/model_family.h"
#include "model/model_settings.h"
#include "model_test_util.h"
#include "training/checkpoint.h"
#include "training/hf_checkpoint.h"
#include "training/torch_checkpoint.h"
#include "training/trainer.h"

namespace megatron {
namespace {

using json = nlohmann::json;
using model::ModelSetting;
using model::TransformerConfig;

// The base model: tiny_config (model_test_util.h), and the flags that give it.
const char* const kBaseFlags =
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--max-position-embeddings 20";

TransformerConfig base_config() { return model::testing::tiny_config(); }

struct Variant {
  TransformerConfig base, changed;
  std::string base_flags, flags;  // the CLI flags beyond kBaseFlags that give base / changed
};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// The rows Megatron spells with more than one argument, or with an inverted switch.
std::map<std::string, Variant> special_variants() {
  std::map<std::string, Variant> v;
  const TransformerConfig b = base_config();
  auto with = [&](auto change, std::string flags, std::string base_flags = "") {
    Variant x{b, b, std::move(base_flags), std::move(flags)};
    change(x.changed);
    return x;
  };
  v["num_query_groups"] = with([](TransformerConfig& c) { c.num_query_groups = 2; },
                               "--group-query-attention --num-query-groups 2");
  // (one MLP width on both sides: --swiglu alone would narrow it, a shape change)
  Variant act = with([](TransformerConfig& c) { c.activation = "swiglu"; },
                     "--swiglu --ffn-hidden-size 128", "--ffn-hidden-size 128");
  act.base.ffn_hidden_size = act.changed.ffn_hidden_size = 128;
  v["activation"] = act;
  v["window_size"] = with([](TransformerConfig& c) { c.window_left = 4; c.window_right = 0; },
                          "--window-size 4 0");
  // (the exact GeLU on both sides: without biases Megatron has no fused tanh GeLU)
  Variant bias = with([](TransformerConfig& c) { c.add_bias_linear = false; },
                      "--disable-bias-linear", "--no-bias-gelu-fusion");
  bias.base.activation = bias.changed.activation = "gelu";
  v["add_bias_linear"] = bias;
  // The QKV bias shows only without the other biases.
  Variant qkv = with([](TransformerConfig& c) { c.add_qkv_bias = true; },
                     "--disable-bias-linear --add-qkv-bias", "--disable-bias-linear");
  qkv.base.add_bias_linear = qkv.changed.add_bias_linear = false;
  qkv.base.activation = qkv.changed.activation = "gelu";
  v["add_qkv_bias"] = qkv;
  return v;
}

// A row that is one field: the field changed, and its flag with the new value.
Variant generic_variant(const ModelSetting& s) {
  Variant x{base_config(), base_config(), "", ""};
  const std::string opt = s.option.substr(0, s.option.find(','));
  std::visit(
      [&](auto f) {
        using F = decltype(f);
        if constexpr (std::is_same_v<F, std::monostate>) {
          ADD_FAILURE() << s.key << ": no field and no variant in special_variants()";
        } else if constexpr (std::is_same_v<F, bool TransformerConfig::*>) {
          x.changed.*f = !(x.base.*f);
          ASSERT_TRUE(x.changed.*f) << s.key << ": a switch that turns the setting on";
          x.flags = opt;
        } else if constexpr (std::is_same_v<F, std::string TransformerConfig::*>) {
          for (const char* c : s.choices)
            if (x.base.*f != c) {
              x.changed.*f = c;
              break;
            }
          ASSERT_NE(x.changed.*f, x.base.*f) << s.key << ": no second choice";
          x.flags = opt + " " + x.changed.*f;
        } else {
          const auto v = x.base.*f;
          x.changed.*f = v != 0 ? decltype(v)(v / 2 + (std::is_integral_v<decltype(v)> ? 3 : 0))
                                : decltype(v)(24);
          x.flags = opt + " " + number(double(x.changed.*f));
        }
      },
      s.field);
  return x;
}

Variant variant_of(const ModelSetting& s) {
  static const std::map<std::string, Variant> special = special_variants();
  if (auto it = special.find(s.key); it != special.end()) return it->second;
  if (std::string(s.key) == "attention_mask_type") {  // fixed by the model family: no flag
    Variant x{base_config(), base_config(), "", ""};
    x.changed.attention_mask_type = "bidirectional";
    return x;
  }
  return generic_variant(s);
}

// Every row's value alike; `architecture`: only the architecture rows (not the Recorded ones,
// which the model flags and Megatron's model arguments of the table do not carry).
void expect_same_settings(const TransformerConfig& want, const TransformerConfig& got,
                          const std::string& where, bool architecture = false) {
  for (const ModelSetting& s : model::model_settings()) {
    if (architecture && s.effect == model::SettingEffect::Recorded) continue;
    EXPECT_EQ(s.show(got), s.show(want)) << where << ": setting " << s.key;
  }
}

// The base model's flags with `flags` (which replace a base flag they repeat) parsed and resolved.
TransformerConfig from_cli(const std::string& flags) {
  std::istringstream base(kBaseFlags), given(flags);
  std::set<std::string> named;
  for (std::string w; given >> w;) named.insert(w);
  std::string line = flags;
  for (std::string flag, value; base >> flag >> value;)
    if (!named.count(flag)) line += " " + flag + " " + value;
  CLI::App app;
  cli::ModelFlags f;
  f.add(app, true);
  app.parse(line, false);
  return f.resolve();
}

training::TrainingArgs args_with(const TransformerConfig& c) {
  training::TrainingArgs a;
  a.model = c;
  return a;
}

TEST(ModelSettings, EveryRowRoundTripsThroughEveryCodec) {
  ASSERT_FALSE(model::model_settings().empty());
  for (const ModelSetting& s : model::model_settings()) {
    if (s.effect == model::SettingEffect::Recorded) continue;  // the test below
    SCOPED_TRACE(s.key);
    const Variant v = variant_of(s);
    ASSERT_NE(s.show(v.changed), s.show(v.base)) << "the variant does not change the setting";

    // CLI -> config (rows the model family fixes have no flag).
    if (!s.flags.empty()) {
      expect_same_settings(v.base, from_cli(v.base_flags), "CLI base", true);
      expect_same_settings(v.changed, from_cli(v.flags), "CLI " + v.flags, true);
    } else {
      EXPECT_TRUE(s.megatron_args.empty()) << "a setting without a flag has no Megatron argument";
    }

    // config -> metadata.json "args"."model" -> config; the row's key is recorded.
    json meta;
    model::to_json(meta, v.changed);
    const model::RecordedConfig ours = model::config_from_checkpoint_args(json{{"model", meta}});
    expect_same_settings(v.changed, ours.config, "metadata.json");
    EXPECT_TRUE(ours.recorded.count(s.key));

    // config -> Megatron's flat arguments -> config; every argument the row names is written.
    if (!s.megatron_args.empty()) {
      const json flat = model::megatron_model_args(v.changed);
      for (const char* a : s.megatron_args) EXPECT_TRUE(flat.contains(a)) << a;
      const model::RecordedConfig theirs = model::config_from_checkpoint_args(flat);
      expect_same_settings(v.changed, theirs.config, "Megatron arguments", true);
      EXPECT_TRUE(theirs.recorded.count(s.key));

      // config -> a .pt file's argparse.Namespace -> our argument set -> config.
      pickle::Document doc;
      const training::TrainingArgs a = args_with(v.changed);
      const pickle::Value* ns =
          training::torch_args::to_namespace(doc, training::training_args_to_json(a), flat);
      const training::TrainingArgs back =
          training::training_args_from_json(training::torch_args::from_namespace(*ns, "test"));
      expect_same_settings(v.changed, back.model, ".pt Namespace", true);
    }

    // The resume checks: the same setting passes; another value is refused, naming the flag
    // (a shape by check_checkpoint_args; a function unless --override-checkpoint-model-args).
    training::CheckpointOnDisk ckpt;
    ckpt.dir = "/ckpt/iter_0000001";
    ckpt.state.args = training::training_args_to_json(args_with(v.base));
    EXPECT_NO_THROW(training::check_checkpoint_args(ckpt, args_with(v.base), false));
    training::TrainingArgs changed = args_with(v.changed);
    const std::string flag = std::string(s.key) == "activation"
                                 ? model::activation_flag(v.changed.activation)
                                 : model::setting_flags_text(s);
    try {
      training::check_checkpoint_args(ckpt, changed, false);
      ADD_FAILURE() << "a changed setting was accepted on resume";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
    if (s.effect == model::SettingEffect::Function) {
      changed.override_checkpoint_model_args = true;
      EXPECT_NO_THROW(training::check_model_function_args(ckpt, changed));
    }
  }
}

// The rows a checkpoint records beside the architecture (SettingEffect::Recorded): each one's
// value goes through metadata.json and back (TransformerConfig's JSON is the table's walk), and
// no Megatron argument or model flag of the table stands for it.
TEST(ModelSettings, EveryRecordedRowRoundTripsThroughMetadata) {
  int rows = 0;
  for (const ModelSetting& s : model::model_settings()) {
    if (s.effect != model::SettingEffect::Recorded) continue;
    SCOPED_TRACE(s.key);
    ++rows;
    EXPECT_TRUE(s.flags.empty() && s.megatron_args.empty());
    TransformerConfig changed = base_config();
    if (std::string(s.key) == "params_dtype") {
      changed.params_dtype = DType::BF16;
    } else if (std::string(s.key) == "moe_layer_freq") {
      changed.moe_layer_freq = "[1,0]";
    } else {
      std::visit(
          [&](auto f) {
            using F = decltype(f);
            if constexpr (std::is_same_v<F, std::monostate>) {
              ADD_FAILURE() << "no field and no variant here";
            } else if constexpr (std::is_same_v<F, bool TransformerConfig::*>) {
              changed.*f = !(changed.*f);
            } else if constexpr (std::is_same_v<F, std::string TransformerConfig::*>) {
              changed.*f += "_other";  // a name, not necessarily a known one: kept as it is
            } else {
              changed.*f = changed.*f != 0 ? decltype(changed.*f + 0)(changed.*f * 2 + 1)
                                           : decltype(changed.*f + 0)(3);
            }
          },
          s.field);
    }
    ASSERT_NE(s.show(changed), s.show(base_config())) << "the variant does not change the setting";
    json meta;
    model::to_json(meta, changed);
    TransformerConfig back;
    model::from_json(meta, back);
    expect_same_settings(changed, back, "metadata.json");
    const model::RecordedConfig r = model::config_from_checkpoint_args(json{{"model", meta}});
    EXPECT_TRUE(r.recorded.count(s.key));
    EXPECT_EQ(s.show(r.config), s.show(changed));
  }
  EXPECT_GE(rows, 30);  // the family, the run settings and the MoE block
  // A key the table does not know is left alone; an unknown dtype is an Error naming it.
  json meta;
  model::to_json(meta, base_config());
  meta["params_dtype"] = "float8";
  TransformerConfig back;
  try {
    model::from_json(meta, back);
    ADD_FAILURE() << "an unknown params_dtype was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("params_dtype 'float8'"), std::string::npos) << e.what();
  }
}

// ---- Hugging Face config.json: every row's column per architecture ---------------------------

// config.json of `c` as architecture `arch` writes it, read back.
TransformerConfig hf_round_trip(model::HfArch arch, const TransformerConfig& c) {
  const nlohmann::ordered_json j =
      training::hf_config_json(model::kHfArchNames[size_t(arch)], c, 64, DType::F32, 1, 2);
  return training::hf_config_to_model(model::HfConfigFile{json::parse(j.dump()), "config.json"});
}

// Values of row `s` other than `base`'s: the CLI variant's two sides, or one from the field; only
// the configurations a run accepts (validate()).
std::vector<TransformerConfig> hf_variants(const ModelSetting& s, const TransformerConfig& base) {
  std::vector<TransformerConfig> out;
  auto add = [&](const TransformerConfig& from) {
    TransformerConfig c = base;
    s.copy(c, from);
    if (s.show(c) == s.show(base)) return;
    try {
      c.validate();
    } catch (const Error&) {
      return;
    }
    out.push_back(c);
  };
  const std::string key = s.key;
  if (s.effect != model::SettingEffect::Recorded &&
      (special_variants().count(key) || key == "attention_mask_type")) {
    const Variant v = variant_of(s);
    add(v.changed);
    add(v.base);
    return out;
  }
  TransformerConfig c = base;
  if (key == "params_dtype") {
    c.params_dtype = DType::BF16;
  } else {
    std::visit(
        [&](auto f) {
          using F = decltype(f);
          if constexpr (std::is_same_v<F, std::monostate>) {
            ADD_FAILURE() << key << ": no field and no variant";
          } else if constexpr (std::is_same_v<F, bool TransformerConfig::*>) {
            c.*f = !(c.*f);
          } else if constexpr (std::is_same_v<F, std::string TransformerConfig::*>) {
            for (const char* choice : s.choices)
              if (c.*f == base.*f && c.*f != choice) c.*f = choice;
            if (c.*f == base.*f) c.*f += "_other";
          } else {
            using T = std::remove_reference_t<decltype(c.*f)>;
            const bool rate = key.ends_with("_dropout");
            c.*f = c.*f != 0 ? T(c.*f / 2 + (std::is_integral_v<T> ? 3 : 0)) : T(rate ? 0.25 : 24);
          }
        },
        s.field);
  }
  add(c);
  return out;
}

// Every row through every architecture: a column is set; a value of the row on the architecture's
// base model exports as that architecture and comes back through config.json (a Key or Fixed
// column), or is refused naming the setting; the rows that choose the architecture (the position
// embedding, the family) may make it another one.
TEST(ModelSettings, EveryRowMapsToEveryHuggingFaceArchitectureOrIsRefused) {
  TransformerConfig gpt2 = base_config();
  TransformerConfig llama = gpt2;
  llama.normalization = "RMSNorm", llama.activation = "swiglu", llama.position_embedding_type = "rope";
  llama.add_bias_linear = false, llama.untie_embeddings_and_output_weights = true;
  TransformerConfig bert = gpt2;
  bert.model_family = "bert", bert.attention_mask_type = "bidirectional", bert.activation = "gelu";
  TransformerConfig mixtral = llama;
  mixtral.num_moe_experts = 4, mixtral.moe_router_topk = 2;
  TransformerConfig qwen2_moe = mixtral;
  qwen2_moe.moe_shared_expert_intermediate_size = 16, qwen2_moe.moe_shared_expert_gate = true;
  qwen2_moe.add_qkv_bias = true;
  const TransformerConfig bases[] = {gpt2, llama, bert, mixtral, qwen2_moe};
  static_assert(std::size(bases) == model::kHfArchCount);
  int refused = 0, mapped = 0;
  for (size_t a = 0; a < model::kHfArchCount; ++a) {
    const model::HfArch arch = model::HfArch(a);
    const std::string name = model::kHfArchNames[a];
    const TransformerConfig& base = bases[a];
    ASSERT_EQ(training::hf_model_type(base), name);
    const nlohmann::ordered_json written =
        training::hf_config_json(name, base, 64, DType::F32, 1, 2);
    const TransformerConfig base_back = hf_round_trip(arch, base);
    for (const ModelSetting& s : model::model_settings()) {
      SCOPED_TRACE(name + ": " + s.key);
      const model::HfMapping& m = s.hf[a];
      ASSERT_NE(m.role, model::HfRole::Unmapped) << "no Hugging Face column";
      const bool carried = m.role == model::HfRole::Key || m.role == model::HfRole::Fixed;
      if (!carried) {
        EXPECT_NE(*m.note, '\0') << "a setting left out of config.json says where it goes";
      }
      if (m.role == model::HfRole::Key) {
        EXPECT_FALSE(m.keys.empty());
        for (const char* k : m.keys) EXPECT_TRUE(written.contains(k)) << k;
      }
      if (carried) {
        EXPECT_EQ(s.show(base_back), s.show(base));
      }
      for (const TransformerConfig& changed : hf_variants(s, base)) {
        std::string type;
        try {
          type = training::hf_model_type(changed);
        } catch (const Error& e) {
          const std::string msg = e.what();
          bool named = msg.find(s.key) != std::string::npos;
          for (const char* f : s.flags) named = named || msg.find(f) != std::string::npos;
          const std::string key = s.key;
          if (key != "position_embedding_type" && key != "model_family" && key != "num_moe_experts" &&
              key != "moe_shared_expert_intermediate_size") {  // (the rows that choose the class)
            EXPECT_TRUE(named) << msg;
          }
          ++refused;
          continue;
        }
        if (type != name) {  // the setting chose another class (experts: Mixtral)
          EXPECT_TRUE(std::string(s.key) == "position_embedding_type" ||
                      std::string(s.key) == "model_family" || std::string(s.key) == "num_moe_experts" ||
                      std::string(s.key) == "moe_shared_expert_intermediate_size") << type;
          continue;
        }
        if (carried) {
          EXPECT_EQ(s.show(hf_round_trip(arch, changed)), s.show(changed));
          ++mapped;
        }
      }
    }
  }
  EXPECT_GT(refused, 20);
  EXPECT_GT(mapped, 20);
}

// The enumerated settings (recompute granularity and method, --cp-comm-type, the model family)
// map their names to kinds in one place: each name gives its kind, an unknown one is an Error
// listing the names, and the CLI's choices are the table's names.
TEST(ModelKinds, EnumeratedSettingsMapNamesToKindsOnce) {
  auto error_of = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  TransformerConfig c = base_config();
  for (const model::RecomputeGranularityKind& k : model::kRecomputeGranularityKinds) {
    c.recompute_granularity = k.name;
    EXPECT_EQ(c.recompute_granularity_id(), k.id) << k.label;
  }
  EXPECT_TRUE((c.recompute_granularity = "full", c.full_recompute()));
  EXPECT_TRUE((c.recompute_granularity = "selective", c.selective_recompute()));
  c.recompute_granularity = "partial";
  EXPECT_EQ(error_of([&] { c.validate(); }),
            "--recompute-granularity 'partial' is not one of: full, selective");
  c.recompute_granularity = "full";
  c.recompute_num_layers = 1;
  for (const model::RecomputeMethodKind& k : model::kRecomputeMethodKinds) {
    c.recompute_method = k.name;
    EXPECT_EQ(c.recompute_method_id(), k.id) << k.name;
  }
  c.recompute_method = "";
  EXPECT_EQ(error_of([&] { c.validate(); }),
            "--recompute-granularity full needs --recompute-method uniform or block");
  c.recompute_method = "block";
  EXPECT_NO_THROW(c.validate());
  c = base_config();
  for (const model::CpCommTypeKind& k : model::cp_comm_type_kinds()) {
    c.cp_comm_type = k.name;
    if (k.implemented) {
      EXPECT_EQ(c.cp_comm_type_id(), k.id) << k.name;
      EXPECT_NO_THROW(c.validate());
    } else {
      EXPECT_NE(error_of([&] { c.validate(); }).find("is not implemented"), std::string::npos);
    }
  }
  c.cp_comm_type = "ring";
  EXPECT_EQ(error_of([&] { c.validate(); }), "--cp-comm-type must be p2p or allgather, got 'ring'");
  c = base_config();
  for (const model::ModelFamily& f : model::model_families()) {
    c.model_family = f.name;
    EXPECT_EQ(c.family_id(), f.id) << f.name;
    EXPECT_EQ(&model::model_family_of(c), &f);
  }
  c.model_family = "gpt3";
  EXPECT_EQ(error_of([&] { c.validate(); }), "model family 'gpt3' is not one of: gpt, bert, t5");
  EXPECT_EQ(model::recompute_granularity_names(), (std::vector<std::string>{"full", "selective"}));
  EXPECT_EQ(model::recompute_method_names(), (std::vector<std::string>{"uniform", "block"}));
  EXPECT_EQ(model::cp_comm_type_names(),
            (std::vector<std::string>{"p2p", "a2a", "allgather", "a2a+p2p"}));
  EXPECT_EQ(model::model_family_names(), (std::vector<std::string>{"gpt", "bert", "t5"}));
}

// Every activation kind, with and without biases, through Megatron's switches and back.
TEST(ModelSettings, EveryActivationThroughMegatronSwitches) {
  for (const model::ActivationKind& k : model::activation_kinds())
    for (bool bias : {true, false}) {
      TransformerConfig c = base_config();
      c.activation = k.name;
      c.add_bias_linear = bias;
      // Megatron has no fused bias-GeLU without biases: the tanh form needs --openai-gelu.
      const model::RecordedConfig r =
          model::config_from_checkpoint_args(model::megatron_model_args(c));
      EXPECT_EQ(r.config.activation, c.activation) << k.name << " bias " << bias;
    }
}

// Older checkpoints: the legacy position-embedding enum and the older epsilon name.
TEST(ModelSettings, OlderMegatronSpellings) {
  const json legacy = {{"position_embedding_type", "rotary"}, {"layernorm_epsilon", 1e-6}};
  const model::RecordedConfig r = model::config_from_checkpoint_args(legacy);
  EXPECT_EQ(r.config.position_embedding_type, "rope");
  EXPECT_FLOAT_EQ(r.config.layernorm_epsilon, 1e-6f);
  EXPECT_EQ(model::config_from_checkpoint_args(json{{"position_embedding_type", "absolute"},
                                                    {"add_position_embedding", false}})
                .config.position_embedding_type,
            "none");
  try {
    model::config_from_checkpoint_args(json{{"window_size", "4,0"}});
    ADD_FAILURE() << "a malformed window_size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window_size"), std::string::npos) << e.what();
  }
}

// The kind tables: every name resolves to its own row, an unknown name lists the valid ones.
TEST(ModelSettings, KindTablesResolveNames) {
  for (const model::PositionEmbeddingKind& k : model::position_embedding_kinds())
    EXPECT_EQ(&model::position_embedding_kind(k.name), &k);
  for (const model::AttentionMaskKind& k : model::attention_mask_kinds())
    EXPECT_EQ(&model::attention_mask_kind(k.name), &k);
  try {
    model::position_embedding_kind("sinusoidal");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("learned_absolute, rope, alibi, none"), std::string::npos);
  }
}

}  // namespace
}  // namespace megatron
