// Megatron's check_checkpoint_args, and the settings that change what the model computes: both
// compared between a checkpoint's recorded arguments and this run's before any weight is loaded.
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/model_settings.h"
#include "training/checkpoint.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Checked by check_checkpoint_args (the tensors' shapes), not here.
bool is_shape_setting(const std::string& key) {
  static const std::set<std::string> shape = {
      "num_layers",      "hidden_size",      "num_attention_heads",    "ffn_hidden_size",
      "kv_channels",     "num_query_groups", "max_position_embeddings"};
  return shape.count(key) > 0;
}

}  // namespace

void check_model_function_args(const CheckpointOnDisk& ckpt, const TrainingArgs& args) {
  const std::string where = (ckpt.dir / "metadata.json").string();
  const model::RecordedConfig saved = model::config_from_checkpoint_args(ckpt.state.args);
  {  // the mixture-of-experts settings: each must match the checkpoint's
    nlohmann::json was, now;
    to_json(was, saved.config);
    to_json(now, args.model);
    for (auto it = now.begin(); it != now.end(); ++it) {
      const std::string& k = it.key();
      if (k != "num_moe_experts" && !k.starts_with("moe_")) continue;
      MG_REQUIRE(was.contains(k) && was.at(k) == it.value(), "the checkpoint ", where,
                 " was trained with ", k, " = ", was.contains(k) ? was.at(k).dump() : "(none)",
                 " but this run gives ", it.value().dump(), "; give the checkpoint's MoE flags");
    }
  }
  std::vector<std::string> overridden;
  for (const model::ModelSetting& s : model::model_settings()) {
    if (is_shape_setting(s.key)) continue;
    const std::string was = s.show(saved.config), now = s.show(args.model);
    if (was == now) continue;
    std::string flag;
    if (std::string(s.key) == "activation") {
      flag = model::activation_flag(args.model.activation);
    } else {
      for (const char* f : s.flags) flag += (flag.empty() ? "" : " / ") + std::string(f);
      if (flag.empty()) flag = s.key;  // fixed by the model type, not by a flag
    }
    const std::string what =
        str(flag, ": the checkpoint ", where, " was trained with ", s.key, " = ", was,
            saved.recorded.count(s.key) ? "" : " (not recorded: the default then)",
            " but this run gives ", now);
    if (args.override_checkpoint_model_args) {
      overridden.push_back(what);
      continue;
    }
    MG_THROW(what, ". The weights would compute a different function; pass the checkpoint's "
             "setting, or --override-checkpoint-model-args to change it deliberately");
  }
  for (const auto& o : overridden)
    log_warn("--override-checkpoint-model-args: ", o, "; continuing with this run's value");
}

void check_checkpoint_args(const CheckpointOnDisk& ckpt, const TrainingArgs& a, bool finetune) {
  TrainingArgs c;
  try {
    c = training_args_from_json(ckpt.state.args);
  } catch (const json::exception& e) {
    MG_THROW((ckpt.dir / "metadata.json").string(), ": malformed \"args\": ", e.what());
  }
  const std::string where = (ckpt.dir / "metadata.json").string();
  auto same = [&](const char* flag, auto saved, auto given) {
    MG_REQUIRE(saved == given, flag, ": the checkpoint ", where, " has ", saved,
               " but this run gives ", given,
               finetune ? " (the model's tensors must match the checkpoint's)"
                        : " (model-shape flags must match the checkpoint when resuming)");
  };
  same("--num-layers", c.model.num_layers, a.model.num_layers);
  same("--hidden-size", c.model.hidden_size, a.model.hidden_size);
  same("--num-attention-heads", c.model.num_attention_heads, a.model.num_attention_heads);
  same("--ffn-hidden-size", c.model.ffn(), a.model.ffn());
  same("--kv-channels", c.model.head_dim(), a.model.head_dim());
  same("--num-query-groups", c.model.query_groups(), a.model.query_groups());
  same("--max-position-embeddings", c.model.max_position_embeddings, a.model.max_position_embeddings);
  same("padded vocabulary size (--vocab-size / --vocab-file, --make-vocab-size-divisible-by)",
       c.model.padded_vocab_size, a.model.padded_vocab_size);
  if (!finetune) {
    same("--seq-length", c.model.seq_length, a.model.seq_length);
    same("parameter dtype (--fp16 / --bf16)", std::string(dtype_name(c.model.params_dtype)),
         std::string(dtype_name(a.model.params_dtype)));
  }
  check_model_function_args(ckpt, a);
}

}  // namespace megatron::training
