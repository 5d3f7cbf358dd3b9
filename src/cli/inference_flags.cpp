// Model flags of generate/serve and --use-checkpoint-args; see inference_flags.h.
#include "cli/inference_flags.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "cli/device_flag.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/device_select.h"
#include "inference/checkpoint_args.h"
#include "model/model_family.h"
#include "model/model_settings.h"

namespace megatron::cli {

namespace {

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

bool is_bool_setting(const model::ModelSetting& s, const model::TransformerConfig& c) {
  const std::string v = s.show(c);
  return v == "true" || v == "false";
}

}  // namespace

void InferenceFlags::add(CLI::App& sub) {
  app_ = &sub;
  auto& o = options;
  sub.add_option("--load", o.load, "Checkpoint folder (Megatron layout)")->required();
  sub.add_option("--ckpt-step", ckpt_step, "Iteration to load instead of the latest");
  sub.add_flag("--use-checkpoint-args", use_checkpoint_args,
               "Take the model settings from the checkpoint's metadata.json (flags must agree)");
  model.add(sub, /*training=*/false);
  sub.add_option("--make-vocab-size-divisible-by", o.make_vocab_size_divisible_by,
                 "Vocabulary padding multiple")
      ->capture_default_str();
  add_tokenizer_options(sub, o.tokenizer)->required();
  add_inference_compat_flags(sub, *this);
  add_device_option(sub, device);
}

void InferenceFlags::apply_checkpoint_args(model::TransformerConfig& cfg,
                                           const inference::CheckpointArgs& ck, bool check_only) {
  const model::RecordedConfig rec = model::config_from_checkpoint_args(ck.args());
  // Serving and zero-shot evaluation run a decoder-only language model (evaluate also BERT, and
  // generate, serve and evaluate also T5); another family's weights would not load into one (or
  // would load into the wrong model).
  if (accept_bert && rec.config.family_id() == model::ModelFamilyId::bert) {  // evaluate's masked-LM evaluation
    cfg.model_family = rec.config.model_family;
    cfg.bert_binary_head = rec.config.bert_binary_head;
    cfg.attention_mask_type = rec.config.attention_mask_type;
  }
  if (accept_t5 && rec.config.family_id() == model::ModelFamilyId::t5) {  // span filling, its loss
    cfg.model_family = rec.config.model_family;
    apply_t5_checkpoint_args(ck, check_only);
  }
  MG_REQUIRE(rec.config.family_id() != model::ModelFamilyId::t5 || cfg.family_id() == model::ModelFamilyId::t5, ck.file().string(),
             " is a checkpoint of a T5 model (pretrain-t5 trains it); `megatron generate` and "
             "`megatron serve` fill the <extra_id_N> spans of prompts with it and `megatron "
             "evaluate` scores its loss on pretrain-t5's data");
  MG_REQUIRE(rec.config.model_family == cfg.model_family, ck.file().string(), " is a checkpoint of a ",
             rec.config.model_family, " model (", model::model_family_of(rec.config).command,
             " trains it): text generation, serving and zero-shot evaluation need a GPT "
             "checkpoint (pretrain-gpt)");
  {  // A mixture-of-experts model's settings come from its checkpoint (these commands have no
     // MoE flags). Inference routes every token to its top-k experts without a capacity (no
     // token dropping), so a token's experts do not depend on the others in its batch: cached
     // decoding equals recomputation.
    cfg.copy_moe_settings(rec.config);
    cfg.moe_expert_capacity_factor = 0;
    cfg.moe_pad_expert_input_to_capacity = false;
  }
  // Without the shape flags finish() asks for them (or --use-checkpoint-args) first.
  if (check_only && (cfg.num_layers <= 0 || cfg.hidden_size <= 0 || cfg.num_attention_heads <= 0))
    return;
  std::vector<std::string> taken;
  if (!check_only)
    for (const auto& [key, flag] : {std::pair<const char*, const char*>{"num_layers", "--num-layers"},
                                    {"hidden_size", "--hidden-size"},
                                    {"num_attention_heads", "--num-attention-heads"}})
      MG_REQUIRE(rec.recorded.count(key) || given(flag), "--use-checkpoint-args: ",
                 ck.file().string(), " has no \"", key, "\" in its args; pass ", flag);
  // How the flags' side of a setting reads in an error: the flags as given, or the default.
  auto describe = [&](const model::ModelSetting& s) {
    std::vector<std::string> flags;
    for (const char* f : s.flags)
      if (given(f)) flags.push_back(f);
    const std::string value = s.show(cfg);
    const std::string key = s.key;
    if (key == "num_query_groups" && given("--num-query-groups"))
      return str("--num-query-groups ", cfg.query_groups());
    if (key == "max_position_embeddings" && flags.empty() && given("--seq-length"))
      return str("--seq-length (no --max-position-embeddings) ", value);
    if (key == "activation") {
      std::string joined;
      for (const auto& f : flags) joined += (joined.empty() ? "" : " ") + f;
      if (!joined.empty()) return str(joined, " (", value, ")");
      const std::string want = model::activation_flag(rec.config.activation);
      return str("the default activation (", value, "; pass ", want, " for the checkpoint's)");
    }
    if (key == "window_size" && !flags.empty() && flags.front() != std::string("--window-size"))
      return str("--pre-tockens ", model.pre_tockens, " --next-tockens ", model.next_tockens,
                 " (window ", value, ")");
    if (is_bool_setting(s, cfg)) {
      if (!flags.empty()) return flags.front();
      return s.flags.empty() ? str("the default ", key, " ", value) : str("no ", s.flags.front());
    }
    if (!flags.empty()) return str(flags.back(), " ", value);
    return s.flags.empty() ? str("the default ", key, " ", value)
                           : str("the default ", s.flags.front(), " ", value);
  };
  for (const model::ModelSetting& s : model::model_settings()) {
    const std::string key = s.key;
    if (s.effect == model::SettingEffect::Recorded || !rec.recorded.count(key)) continue;
    const bool chosen = std::any_of(s.flags.begin(), s.flags.end(),
                                    [&](const char* f) { return given(f); });
    if (key == "max_position_embeddings" && check_only &&
        (!cfg.learned_position_embedding() || cfg.max_position_embeddings == 0))
      continue;  // only the position table makes the length part of the weights
    if (!check_only && !chosen) {
      s.copy(cfg, rec.config);
      taken.push_back(key + "=" + s.show(cfg));
      continue;
    }
    if (s.show(cfg) != s.show(rec.config)) contradiction(describe(s), key, s.show(rec.config), ck, check_only);
  }
  if (!check_only && !given("--seq-length"))
    if (const auto seq = ck.get_int("seq_length")) cfg.seq_length = int(*seq);
  if (const auto div = ck.get_int("make_vocab_size_divisible_by")) {
    if (given("--make-vocab-size-divisible-by") || check_only) {
      if (*div != options.make_vocab_size_divisible_by)
        contradiction(str(given("--make-vocab-size-divisible-by") ? "" : "the default ",
                          "--make-vocab-size-divisible-by ", options.make_vocab_size_divisible_by),
                      "make_vocab_size_divisible_by", std::to_string(*div), ck, check_only);
    } else {
      options.make_vocab_size_divisible_by = *div;
      taken.push_back(str("make_vocab_size_divisible_by=", *div));
    }
  }
  // The tokenizer flags stay required (they name files); the type must agree.
  std::optional<std::string> tok = ck.get_string("tokenizer_type");
  if (!tok) tok = ck.get_string("tokenizer.type");
  if (tok && *tok != options.tokenizer.type)
    contradiction("--tokenizer-type " + options.tokenizer.type, "tokenizer type", "'" + *tok + "'",
                  ck, check_only);
  if (check_only) return;
  std::string list;
  for (const auto& t : taken) list += (list.empty() ? "" : ", ") + t;
  log_info("--use-checkpoint-args: from ", ck.file().string(), ": ", list.empty() ? "nothing new" : list);
}

// A T5 checkpoint's sentinels: --vocab-extra-ids as it was trained (pretrain-t5 records it with
// the tokenizer's settings; Megatron's flat arguments at the top level).
void InferenceFlags::apply_t5_checkpoint_args(const inference::CheckpointArgs& ck, bool check_only) {
  std::optional<int64_t> extra = ck.get_int("tokenizer.vocab_extra_ids");
  if (!extra) extra = ck.get_int("vocab_extra_ids");
  if (!extra) return;
  int& flag = options.tokenizer.vocab_extra_ids;
  if (!check_only && !given("--vocab-extra-ids")) {
    flag = int(*extra);
    return;
  }
  if (flag != *extra)
    contradiction(str(given("--vocab-extra-ids") ? "" : "the default ", "--vocab-extra-ids ", flag),
                  "vocab_extra_ids", std::to_string(*extra), ck, check_only);
}

inference::InferenceModelOptions InferenceFlags::finish() {
  const std::optional<int64_t> step = ckpt_step >= 0 ? std::optional<int64_t>(ckpt_step) : std::nullopt;
  check_megatron_flags(megatron);
  check_inference_compat_flags(*app_, *this, step);
  model::TransformerConfig cfg = model.resolve();
  // The Ascend band needs the sequence length: from the flags, or else the checkpoint's.
  const bool band_now = !use_checkpoint_args || cfg.seq_length > 0 || cfg.max_position_embeddings > 0;
  if (band_now) model.apply_band(cfg);
  if (use_checkpoint_args) {
    apply_checkpoint_args(cfg, inference::CheckpointArgs::read(options.load, step), false);
  } else if (auto ck = inference::CheckpointArgs::read_if_present(options.load, step)) {
    // The flags describe the model; where the checkpoint's metadata says otherwise (a forgotten
    // --no-bias-gelu-fusion, a wrong epsilon), the weights would load into a different model and
    // the text would be silently wrong.
    apply_checkpoint_args(cfg, *ck, true);
  }
  if (!band_now) model.apply_band(cfg);
  auto o = options;
  if (ckpt_step >= 0) o.ckpt_step = ckpt_step;
  o.device = cuda::select_device(device, 0);
  if (o.device.is_cuda()) log_info("device: ", cuda::describe_device(o.device));
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--num-layers", cfg.num_layers},
                                    {"--hidden-size", cfg.hidden_size},
                                    {"--num-attention-heads", cfg.num_attention_heads}})
    MG_REQUIRE(value > 0, flag, " is required (> 0), or pass --use-checkpoint-args to take the "
               "model shape from the checkpoint");
  if (cfg.max_position_embeddings == 0) cfg.max_position_embeddings = cfg.seq_length;
  MG_REQUIRE(cfg.max_position_embeddings > 0,
             use_checkpoint_args ? "the checkpoint's args have neither max_position_embeddings nor "
                                   "seq_length: pass --max-position-embeddings or --seq-length"
                                 : "pass --max-position-embeddings or --seq-length");
  MG_REQUIRE(cfg.seq_length <= cfg.max_position_embeddings || !cfg.learned_position_embedding(),
             "--seq-length ", cfg.seq_length, " exceeds --max-position-embeddings ",
             cfg.max_position_embeddings);
  // --fp16 / --bf16: the weights are kept in that precision (Megatron's Float16Module).
  cfg.params_dtype = fp16 ? DType::F16 : bf16 ? DType::BF16 : DType::F32;
  o.model = cfg;
  o.tensor_model_parallel_size = tensor_model_parallel_size;
  o.pipeline_model_parallel_size = pipeline_model_parallel_size;
  return o;
}

}  // namespace megatron::cli
