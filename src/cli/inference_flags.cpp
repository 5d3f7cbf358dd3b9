// Model flags of generate/serve and --use-checkpoint-args; see inference_flags.h.
#include "cli/inference_flags.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "inference/checkpoint_args.h"

namespace megatron::cli {

namespace {

using Config = inference::GPTInferenceConfig;
using Activation = Config::Activation;

std::string show(bool v) { return v ? "true" : "false"; }
std::string show(int64_t v) { return std::to_string(v); }
std::string show(double v) { return str(v); }
std::string show(const std::string& v) { return "'" + v + "'"; }

// Checkpoints store float fields widened to double (1e-5f is 9.99999974737875e-06).
bool same(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(std::abs(a), std::abs(b)); }
bool same(int64_t a, int64_t b) { return a == b; }
bool same(bool a, bool b) { return a == b; }
bool same(const std::string& a, const std::string& b) { return a == b; }

template <typename T>
std::optional<T> get(const inference::CheckpointArgs& ck, const std::string& key) {
  if constexpr (std::is_same_v<T, int64_t>) return ck.get_int(key);
  if constexpr (std::is_same_v<T, double>) return ck.get_double(key);
  if constexpr (std::is_same_v<T, bool>) return ck.get_bool(key);
  if constexpr (std::is_same_v<T, std::string>) return ck.get_string(key);
}

// `flags` disagrees with the checkpoint's `key` (= `value`). With --use-checkpoint-args the flag was
// given on purpose; without it (check_only) the value may be a default the user never chose, and
// the model would be built differently from the one that was trained.
[[noreturn]] void contradiction(const std::string& flags, const std::string& key,
                                const std::string& value, const inference::CheckpointArgs& ck,
                                bool check_only = false) {
  if (check_only)
    MG_THROW(flags, " contradicts the checkpoint, whose ", key, " is ", value, " (",
             ck.file().string(), "), so the model would not be the one that was trained; pass "
             "flags that match it, or --use-checkpoint-args to take the shape from the checkpoint");
  MG_THROW("--use-checkpoint-args: ", flags, " contradicts the checkpoint, whose ", key, " is ",
           value, " (", ck.file().string(), "); drop the flag, or load the checkpoint it belongs to");
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::SwiGLU: return "SwiGLU";
    case Activation::GeluTanh: return "GeLU (tanh form)";
    case Activation::Gelu: return "GeLU (exact erf form)";
  }
  return "?";
}

}  // namespace

void InferenceFlags::add(CLI::App& sub) {
  app_ = &sub;
  auto& o = options;
  auto& g = o.gpt;
  sub.add_option("--load", o.load, "Checkpoint folder (Megatron layout)")->required();
  sub.add_option("--ckpt-step", ckpt_step, "Iteration to load instead of the latest");
  sub.add_flag("--use-checkpoint-args", use_checkpoint_args,
               "Take the model shape from the checkpoint's metadata.json (flags must agree)");
  sub.add_option("--num-layers", g.num_layers, "Transformer layers (required without --use-checkpoint-args)");
  sub.add_option("--hidden-size", g.hidden_size, "Hidden size (required without --use-checkpoint-args)");
  sub.add_option("--num-attention-heads", g.num_attention_heads,
                 "Attention heads (required without --use-checkpoint-args)");
  sub.add_option("--ffn-hidden-size", g.ffn_hidden_size, "MLP hidden size (default 4 x hidden)");
  sub.add_option("--kv-channels", g.kv_channels, "Per-head size (default hidden / heads)");
  sub.add_flag("--group-query-attention", group_query_attention, "Grouped-query attention");
  sub.add_option("--num-query-groups", g.num_query_groups, "Query groups with --group-query-attention");
  sub.add_option("--max-position-embeddings", g.max_position_embeddings,
                 "Longest sequence (default --seq-length)");
  sub.add_option("--seq-length", seq_length, "Training sequence length");
  sub.add_option("--normalization", normalization, "LayerNorm or RMSNorm")
      ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}))
      ->capture_default_str();
  sub.add_option("--norm-epsilon,--layernorm-epsilon", g.layernorm_epsilon, "Norm epsilon")
      ->capture_default_str();
  sub.add_flag("--swiglu", swiglu, "SwiGLU MLP");
  sub.add_flag("--openai-gelu", openai_gelu, "GeLU in its tanh approximation");
  sub.add_flag("--no-bias-gelu-fusion", no_bias_gelu_fusion,
               "Exact (erf) GeLU; Megatron's default fused bias-GeLU is the tanh form");
  sub.add_option("--position-embedding-type", position_embedding_type, "learned_absolute or rope")
      ->check(CLI::IsMember({"learned_absolute", "rope"}))
      ->capture_default_str();
  sub.add_option("--rotary-percent", g.rotary_percent, "Fraction of each head rotated")
      ->capture_default_str();
  sub.add_option("--rotary-base", g.rotary_base, "Rotary base")->capture_default_str();
  sub.add_flag("--disable-bias-linear", disable_bias_linear, "No biases in linear layers");
  sub.add_flag("--add-qkv-bias", add_qkv_bias, "QKV bias even with --disable-bias-linear");
  sub.add_flag("--untie-embeddings-and-output-weights", g.untie_embeddings_and_output_weights,
               "Separate output layer");
  sub.add_option("--make-vocab-size-divisible-by", o.make_vocab_size_divisible_by,
                 "Vocabulary padding multiple")
      ->capture_default_str();
  add_tokenizer_options(sub, o.tokenizer)->required();
  add_inference_compat_flags(sub, *this);
}

bool InferenceFlags::given(const std::string& flag) const {
  return app_ != nullptr && app_->get_option(flag)->count() > 0;
}

void InferenceFlags::apply_checkpoint_args(const inference::CheckpointArgs& ck, bool check_only) {
  auto& g = options.gpt;
  // Without the shape flags finish() asks for them (or --use-checkpoint-args) first.
  if (check_only && (g.num_layers <= 0 || g.hidden_size <= 0 || g.num_attention_heads <= 0)) return;
  std::vector<std::string> taken;
  // How a flag's value is shown in an error: as given, or as the default the user left it at.
  auto described = [&](const std::string& flag, const std::string& value) {
    return given(flag) ? flag + (value.empty() ? "" : " " + value)
                       : "the default " + flag + (value.empty() ? "" : " " + value);
  };
  // A value the checkpoint has: checked against the flag when given (or, check_only, always),
  // else taken. `resolve` maps "0 = default" values to what they mean before comparing.
  auto take = [&]<typename T>(const std::string& key, const std::string& flag, T& var,
                              auto resolve) {
    const std::optional<T> v = get<T>(ck, key);
    if (!v) return;
    if (given(flag) || check_only) {
      if (!same(resolve(var), resolve(*v))) {
        std::string value = show(resolve(var));
        if constexpr (std::is_same_v<T, bool>) value = given(flag) ? "" : "off";
        contradiction(described(flag, value), key, show(*v), ck, check_only);
      }
      return;
    }
    var = *v;
    taken.push_back(key + "=" + show(*v));
  };
  auto same_value = [](const auto& v) { return v; };
  auto required = [&](const std::string& key, const std::string& flag, int64_t& var) {
    if (check_only && !given(flag)) return;  // finish() asks for the flag
    MG_REQUIRE(ck.get_int(key) || given(flag), "--use-checkpoint-args: ", ck.file().string(),
               " has no \"", key, "\" in its args; pass ", flag);
    take(key, flag, var, same_value);
  };
  required("num_layers", "--num-layers", g.num_layers);
  required("hidden_size", "--hidden-size", g.hidden_size);
  required("num_attention_heads", "--num-attention-heads", g.num_attention_heads);
  take("ffn_hidden_size", "--ffn-hidden-size", g.ffn_hidden_size,
       [&](int64_t f) { return f > 0 ? f : 4 * g.hidden_size; });
  take("kv_channels", "--kv-channels", g.kv_channels, [&](int64_t k) {
    return k > 0 ? k : (g.num_attention_heads > 0 ? g.hidden_size / g.num_attention_heads : 0);
  });
  if (check_only) {
    // The sequence length is not part of the model; the position table is, once it is known.
    const int64_t positions = g.max_position_embeddings > 0 ? g.max_position_embeddings : seq_length;
    const auto ck_positions = ck.get_int("max_position_embeddings");
    if (positions > 0 && ck_positions && position_embedding_type == "learned_absolute" &&
        positions != *ck_positions)
      contradiction(str(given("--max-position-embeddings") ? "--max-position-embeddings "
                                                           : "--seq-length (no --max-position-embeddings) ",
                        positions),
                    "max_position_embeddings", show(*ck_positions), ck, true);
  } else {
    take("max_position_embeddings", "--max-position-embeddings", g.max_position_embeddings, same_value);
    take("seq_length", "--seq-length", seq_length, same_value);
  }
  if (ck.get_double("layernorm_epsilon"))
    take("layernorm_epsilon", "--norm-epsilon", g.layernorm_epsilon, same_value);
  else
    take("norm_epsilon", "--norm-epsilon", g.layernorm_epsilon, same_value);
  take("normalization", "--normalization", normalization, same_value);
  take("position_embedding_type", "--position-embedding-type", position_embedding_type, same_value);
  take("rotary_percent", "--rotary-percent", g.rotary_percent, same_value);
  take("rotary_base", "--rotary-base", g.rotary_base, same_value);
  take("untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights",
       g.untie_embeddings_and_output_weights, same_value);
  take("add_qkv_bias", "--add-qkv-bias", add_qkv_bias, same_value);
  take("make_vocab_size_divisible_by", "--make-vocab-size-divisible-by",
       options.make_vocab_size_divisible_by, same_value);
  MG_REQUIRE(normalization == "LayerNorm" || normalization == "RMSNorm", ck.file().string(),
             ": normalization ", show(normalization), " is not supported (LayerNorm or RMSNorm)");
  MG_REQUIRE(position_embedding_type == "learned_absolute" || position_embedding_type == "rope",
             ck.file().string(), ": position_embedding_type ", show(position_embedding_type),
             " is not supported (learned_absolute or rope)");

  // add_bias_linear is the inverse of --disable-bias-linear.
  if (const auto bias = ck.get_bool("add_bias_linear")) {
    if ((given("--disable-bias-linear") || check_only) && disable_bias_linear == *bias)
      contradiction(disable_bias_linear ? "--disable-bias-linear" : "no --disable-bias-linear",
                    "add_bias_linear", show(*bias), ck, check_only);
    if (!given("--disable-bias-linear") && !check_only) {
      disable_bias_linear = !*bias;
      taken.push_back("add_bias_linear=" + show(*bias));
    }
  }

  // Grouped-query attention: 0 (or as many groups as heads) is plain multi-head attention.
  const auto ck_groups = ck.get_int("num_query_groups");
  const auto ck_gqa = ck.get_bool("group_query_attention");
  if (ck_groups || (ck_gqa && !*ck_gqa)) {
    auto norm = [&](int64_t n) { return n == g.num_attention_heads ? 0 : std::max<int64_t>(n, 0); };
    const int64_t want = ck_gqa.value_or(true) ? norm(ck_groups.value_or(0)) : 0;
    if (given("--group-query-attention") || given("--num-query-groups") || check_only) {
      const int64_t have = group_query_attention ? norm(g.num_query_groups) : 0;
      if (have != want)
        contradiction(group_query_attention ? str("--num-query-groups ", g.num_query_groups)
                                            : std::string("no --group-query-attention"),
                      "num_query_groups", want > 0 ? show(want) : "none (multi-head attention)", ck,
                      check_only);
    } else {
      group_query_attention = want > 0;
      g.num_query_groups = want;
      taken.push_back("num_query_groups=" + show(want));
    }
  }

  // The activation: our gelu_tanh, or Megatron's swiglu / openai_gelu / bias_gelu_fusion.
  std::optional<Activation> act;
  const auto ck_swiglu = ck.get_bool("swiglu"), ck_tanh = ck.get_bool("gelu_tanh");
  const auto ck_openai = ck.get_bool("openai_gelu"), ck_fusion = ck.get_bool("bias_gelu_fusion");
  if (ck_swiglu && *ck_swiglu) act = Activation::SwiGLU;
  else if (ck_tanh) act = *ck_tanh ? Activation::GeluTanh : Activation::Gelu;
  else if (ck_openai && *ck_openai) act = Activation::GeluTanh;
  else if (ck_fusion) act = *ck_fusion && !disable_bias_linear ? Activation::GeluTanh : Activation::Gelu;
  if (act) {
    std::string flags;
    for (const char* f : {"--swiglu", "--openai-gelu", "--no-bias-gelu-fusion"})
      if (given(f)) flags += (flags.empty() ? "" : " ") + std::string(f);
    if (!flags.empty() || check_only) {
      const Activation have = swiglu ? Activation::SwiGLU
                              : (openai_gelu || (!no_bias_gelu_fusion && !disable_bias_linear))
                                  ? Activation::GeluTanh
                                  : Activation::Gelu;
      if (have != *act) {
        const std::string hint = *act == Activation::Gelu       ? "--no-bias-gelu-fusion"
                                 : *act == Activation::GeluTanh ? "--openai-gelu"
                                                                : "--swiglu";
        contradiction(flags.empty() ? str("the default activation (", activation_name(have),
                                          "; pass ", hint, " for the checkpoint's)")
                                    : str(flags, " (", activation_name(have), ")"),
                      "activation", activation_name(*act), ck, check_only);
      }
    } else {
      swiglu = *act == Activation::SwiGLU;
      openai_gelu = *act == Activation::GeluTanh;
      no_bias_gelu_fusion = *act == Activation::Gelu;
      taken.push_back(str("activation=", activation_name(*act)));
    }
  }

  // The tokenizer flags stay required (they name files); the type must agree.
  std::optional<std::string> tok = ck.get_string("tokenizer_type");
  if (!tok) tok = ck.get_string("tokenizer.type");
  if (tok && *tok != options.tokenizer.type)
    contradiction("--tokenizer-type " + options.tokenizer.type, "tokenizer type", show(*tok), ck,
                  check_only);
  if (check_only) return;

  std::string list;
  for (const auto& t : taken) list += (list.empty() ? "" : ", ") + t;
  log_info("--use-checkpoint-args: from ", ck.file().string(), ": ", list.empty() ? "nothing new" : list);
}

inference::InferenceModelOptions InferenceFlags::finish() {
  const std::optional<int64_t> step = ckpt_step >= 0 ? std::optional<int64_t>(ckpt_step) : std::nullopt;
  check_inference_compat_flags(*app_, *this, step);
  if (use_checkpoint_args) {
    apply_checkpoint_args(inference::CheckpointArgs::read(options.load, step), false);
  } else if (auto ck = inference::CheckpointArgs::read_if_present(options.load, step)) {
    // The flags describe the model; where the checkpoint's metadata says otherwise (a forgotten
    // --openai-gelu, a wrong epsilon), the weights would load into a different model and the
    // text would be silently wrong.
    apply_checkpoint_args(*ck, true);
  }
  auto o = options;
  auto& g = o.gpt;
  if (ckpt_step >= 0) o.ckpt_step = ckpt_step;
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--num-layers", g.num_layers},
                                    {"--hidden-size", g.hidden_size},
                                    {"--num-attention-heads", g.num_attention_heads}})
    MG_REQUIRE(value > 0, flag, " is required (> 0), or pass --use-checkpoint-args to take the "
               "model shape from the checkpoint");
  MG_REQUIRE(!group_query_attention || g.num_query_groups > 0,
             "--group-query-attention needs --num-query-groups");
  if (!group_query_attention) g.num_query_groups = 0;
  if (g.max_position_embeddings == 0) g.max_position_embeddings = seq_length;
  MG_REQUIRE(g.max_position_embeddings > 0,
             use_checkpoint_args ? "the checkpoint's args have neither max_position_embeddings nor "
                                   "seq_length: pass --max-position-embeddings or --seq-length"
                                 : "pass --max-position-embeddings or --seq-length");
  MG_REQUIRE(seq_length == 0 || seq_length <= g.max_position_embeddings || position_embedding_type == "rope",
             "--seq-length ", seq_length, " exceeds --max-position-embeddings ",
             g.max_position_embeddings);
  g.normalization = normalization == "RMSNorm" ? Config::Norm::RMSNorm : Config::Norm::LayerNorm;
  // Megatron: SwiGLU; else --openai-gelu or the fused bias-GeLU (default, needs biases) use the
  // tanh approximation; otherwise F.gelu (erf).
  const bool tanh_gelu = openai_gelu || (!no_bias_gelu_fusion && !disable_bias_linear);
  g.activation = swiglu ? Activation::SwiGLU : tanh_gelu ? Activation::GeluTanh : Activation::Gelu;
  g.position_embedding_type = position_embedding_type == "rope" ? Config::Position::Rope
                                                                : Config::Position::LearnedAbsolute;
  g.add_bias_linear = !disable_bias_linear;
  g.add_qkv_bias = !disable_bias_linear || add_qkv_bias;
  return o;
}

}  // namespace megatron::cli
