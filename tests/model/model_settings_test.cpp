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
#include "model/model_settings.h"
#include "model_test_util.h"
#include "training/checkpoint.h"
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

void expect_same_settings(const TransformerConfig& want, const TransformerConfig& got,
                          const std::string& where) {
  for (const ModelSetting& s : model::model_settings())
    EXPECT_EQ(s.show(got), s.show(want)) << where << ": setting " << s.key;
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
    SCOPED_TRACE(s.key);
    const Variant v = variant_of(s);
    ASSERT_NE(s.show(v.changed), s.show(v.base)) << "the variant does not change the setting";

    // CLI -> config (rows the model family fixes have no flag).
    if (!s.flags.empty()) {
      expect_same_settings(v.base, from_cli(v.base_flags), "CLI base");
      expect_same_settings(v.changed, from_cli(v.flags), "CLI " + v.flags);
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
      expect_same_settings(v.changed, theirs.config, "Megatron arguments");
      EXPECT_TRUE(theirs.recorded.count(s.key));

      // config -> a .pt file's argparse.Namespace -> our argument set -> config.
      pickle::Document doc;
      const training::TrainingArgs a = args_with(v.changed);
      const pickle::Value* ns =
          training::torch_args::to_namespace(doc, training::training_args_to_json(a), flat);
      const training::TrainingArgs back =
          training::training_args_from_json(training::torch_args::from_namespace(*ns, "test"));
      expect_same_settings(v.changed, back.model, ".pt Namespace");
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
