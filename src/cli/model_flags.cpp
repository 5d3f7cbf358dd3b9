// Megatron's model flags and their resolution into a TransformerConfig (see model_flags.h).
#include "cli/model_flags.h"

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/log.h"
#include "model/ascend_band.h"
#include "model/layer_spec.h"
#include "model/model_settings.h"

namespace megatron::cli {

void ModelFlags::add(CLI::App& sub, bool training) {
  app_ = &sub;
  auto& m = config;
  // One registration per row of the settings table (model/model_settings.h): a row that is one
  // field binds its option to it; the others are Megatron's switches resolved in resolve().
  for (const model::ModelSetting& s : model::model_settings()) {
    if (s.effect == model::SettingEffect::Recorded) continue;  // their commands bind their flags
    const std::string key = s.key;
    if (key == "max_position_embeddings")  // not a setting of the weights: the training length
      sub.add_option("--seq-length", m.seq_length, "Sequence length");
    if (s.field.index() != 0) {
      CLI::Option* o = std::visit(
          [&](auto f) -> CLI::Option* {
            if constexpr (std::is_same_v<decltype(f), std::monostate>) {
              return nullptr;
            } else if constexpr (std::is_same_v<decltype(f), bool model::TransformerConfig::*>) {
              return sub.add_flag(s.option, m.*f, s.help);
            } else {
              return sub.add_option(s.option, m.*f, s.help);
            }
          },
          s.field);
      if (!s.choices.empty())
        o->check(CLI::IsMember(std::vector<std::string>(s.choices.begin(), s.choices.end())));
      if (s.effect == model::SettingEffect::Function && o->get_expected_min() > 0)
        o->capture_default_str();
    } else if (key == "num_query_groups") {
      sub.add_flag("--group-query-attention", group_query_attention,
                   "Grouped-query attention (with --num-query-groups)");
      sub.add_option("--num-query-groups", num_query_groups,
                     "Query groups with --group-query-attention (1: multi-query attention)")
          ->capture_default_str();
    } else if (key == "activation") {
      size_t i = 0;
      for (const model::ActivationKind& k : model::activation_kinds()) {
        if (*k.flag != '\0') sub.add_flag(k.flag, activation_selected.at(i), k.help);
        ++i;
      }
      sub.add_flag("--openai-gelu", openai_gelu, "GeLU in its tanh approximation");
      sub.add_flag("--no-bias-gelu-fusion", no_bias_gelu_fusion,
                   "Exact (erf) GeLU; Megatron's default fused bias-GeLU is the tanh form");
    } else if (key == "window_size") {
      sub.add_option("--window-size", window_size,
                     "Sliding-window attention: keys at most LEFT before and RIGHT after each query "
                     "(-1: no limit; causal models: RIGHT 0), as LEFT RIGHT or Megatron's LEFT,RIGHT")
          ->expected(1, 2);
      sub.add_option("--pre-tockens", pre_tockens,
                     "Keys before each query (Ascend's fused attention; with the mask still "
                     "applied): >= the longest sequence - 1 is no bound")
          ->capture_default_str();
      sub.add_option("--next-tockens", next_tockens,
                     "Keys after each query (Ascend); a causal model sees none whatever this says")
          ->capture_default_str();
    } else if (key == "add_bias_linear") {
      sub.add_flag("--disable-bias-linear", disable_bias_linear, "No biases in the linear layers");
    } else {
      MG_REQUIRE(s.flags.empty(), "model setting ", key, " has flags but no CLI binding");
    }
    if (key == "position_embedding_type") {
      sub.add_flag("--no-position-embedding", no_position_embedding,
                   "No learned absolute position embedding (Megatron's older flag)");
      sub.add_flag("--use-rotary-position-embeddings", use_rotary_position_embeddings,
                   "Rotary position embeddings (Megatron's older spelling of "
                   "--position-embedding-type rope)");
    }
  }
  if (training) {
    sub.add_option("--init-method-std", m.init_method_std, "Init std")->capture_default_str();
    sub.add_option("--hidden-dropout", hidden_dropout, "Hidden dropout")->capture_default_str();
    sub.add_option("--attention-dropout", attention_dropout, "Attention dropout")
        ->capture_default_str();
  }
}

bool ModelFlags::given(const std::string& flag) const {
  if (app_ == nullptr) return false;
  try {
    return app_->get_option(flag)->count() > 0;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

void ModelFlags::apply_band(model::TransformerConfig& c) const {
  if (!given("--pre-tockens") && !given("--next-tockens")) return;
  MG_REQUIRE(!given("--window-size"), "--pre-tockens / --next-tockens and --window-size both set a "
             "sliding window; keep one");
  model::TransformerConfig banded = c;
  model::apply_ascend_band(banded, pre_tockens, next_tockens);
  const bool had_window = c.window_left >= 0 || c.window_right >= 0;
  MG_REQUIRE(!had_window || (banded.window_left == c.window_left && banded.window_right == c.window_right),
             "--pre-tockens ", pre_tockens, " --next-tockens ", next_tockens, " give the window (",
             banded.window_left, ", ", banded.window_right, "), but the checkpoint's is (",
             c.window_left, ", ", c.window_right, "); pass the checkpoint's band or leave the flags out");
  if (c.causal() && next_tockens > 0)
    log_info("note: --next-tockens ", next_tockens, ": the causal mask hides every key after its "
             "query, so the band's right side changes nothing for this model");
  c.window_left = banded.window_left;
  c.window_right = banded.window_right;
}

model::TransformerConfig ModelFlags::resolve() const {
  model::TransformerConfig c = config;
  c.hidden_dropout = float(hidden_dropout);
  c.attention_dropout = float(attention_dropout);
  if (c.max_position_embeddings == 0) c.max_position_embeddings = c.seq_length;
  if (!group_query_attention && given("--num-query-groups"))
    log_warn("--num-query-groups ", num_query_groups, " is ignored without "
             "--group-query-attention, as in Megatron: the model has multi-head attention");
  MG_REQUIRE(!group_query_attention || num_query_groups >= 1,
             "--num-query-groups must be >= 1 (got ", num_query_groups, ")");
  c.num_query_groups = group_query_attention ? num_query_groups : 0;
  c.add_bias_linear = !disable_bias_linear;
  // The activation: a selecting flag (--swiglu, --squared-relu), else GeLU in the form
  // Megatron's flags give (activation_from_flags).
  std::string selected, selected_flags;
  size_t i = 0;
  for (const model::ActivationKind& k : model::activation_kinds()) {
    if (*k.flag != '\0' && activation_selected.at(i)) {
      selected_flags += (selected_flags.empty() ? "" : " and ") + std::string(k.flag);
      MG_REQUIRE(selected.empty(), selected_flags, " are mutually exclusive");
      selected = k.name;
    }
    ++i;
  }
  c.activation = !selected.empty()
                     ? selected
                     : model::activation_from_flags(false, false, openai_gelu,
                                                    !no_bias_gelu_fusion, c.add_bias_linear);
  // Megatron's validate_args: without --ffn-hidden-size, --swiglu keeps the parameter count near
  // the 4h MLP's with int((4h * 2 / 3) / 64) * 64 (Python's float division, then truncation).
  if (c.ffn_hidden_size == 0 && c.hidden_size > 0 && c.activation_id() == model::ActivationId::swiglu)
    c.ffn_hidden_size = int(double(4 * c.hidden_size * 2) / 3.0 / 64.0) * 64;
  if (use_rotary_position_embeddings) {
    MG_REQUIRE(!given("--position-embedding-type") || c.rope(),
               "--use-rotary-position-embeddings contradicts --position-embedding-type ",
               c.position_embedding_type);
    c.position_embedding_type = model::kPositionEmbeddingKinds[size_t(model::PositionEmbeddingId::rope)].name;
  }
  if (no_position_embedding && c.learned_position_embedding())
    c.position_embedding_type = model::kPositionEmbeddingKinds[size_t(model::PositionEmbeddingId::none)].name;
  if (!window_size.empty()) {
    // Megatron's tuple_type: "(L,R)" or "L,R" as one value; here also two values.
    std::vector<int64_t> lr;
    for (const std::string& v : window_size) {
      std::string t = v;
      t.erase(std::remove_if(t.begin(), t.end(), [](char ch) { return ch == '(' || ch == ')'; }), t.end());
      for (size_t start = 0; start <= t.size();) {
        const size_t comma = std::min(t.find(',', start), t.size());
        const std::string part = t.substr(start, comma - start);
        char* end = nullptr;
        const long long x = std::strtoll(part.c_str(), &end, 10);
        MG_REQUIRE(!part.empty() && end != nullptr && *end == '\0', "--window-size '", v,
                   "': expected two integers, LEFT RIGHT or LEFT,RIGHT (e.g. 4096,0)");
        lr.push_back(x);
        start = comma + 1;
      }
    }
    MG_REQUIRE(lr.size() == 2, "--window-size takes two numbers: LEFT RIGHT (or LEFT,RIGHT)");
    c.window_left = lr[0];
    c.window_right = lr[1];
  }
  return c;
}

}  // namespace megatron::cli
