// Megatron's check_checkpoint_args, and the settings that change what the model computes: both
// compared between a checkpoint's recorded arguments and this run's before any weight is loaded.
#include "core/error.h"
#include "core/log.h"
#include "model/model_settings.h"
#include "training/checkpoint.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

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
    if (s.effect != model::SettingEffect::Function) continue;  // the shapes: check_checkpoint_args
    const std::string was = s.show(saved.config), now = s.show(args.model);
    if (was == now) continue;
    const std::string flag = std::string(s.key) == "activation"
                                 ? model::activation_flag(args.model.activation)
                                 : model::setting_flags_text(s);
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
  for (const model::ModelSetting& s : model::model_settings())
    if (s.effect == model::SettingEffect::Shape)
      same(model::setting_flags_text(s).c_str(), s.show(c.model), s.show(a.model));
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
