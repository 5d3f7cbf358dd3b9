// Megatron's check_checkpoint_args, and the settings that change what the model computes: both
// compared between a checkpoint's recorded arguments and this run's before any weight is loaded.
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "training/checkpoint.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::vector<ModelSettingKey>& model_function_keys() {
  // One line per recorded setting that changes the function the weights compute. `old_default`
  // is what a checkpoint saved before the key was recorded used (null: the value of a
  // default-constructed TrainingArgs). Shapes are checked separately (check_checkpoint_args).
  // Keys this build does not record yet are skipped until their field exists; name them as
  // Megatron's arguments do, so that the line is already right when it does.
  static const std::vector<ModelSettingKey> keys = {
      {"model.layernorm_epsilon", "--layernorm-epsilon", nullptr},
      {"model.gelu_tanh", "--openai-gelu (GeLU as its tanh approximation; without it, erf)", false},
      {"model.normalization", "--normalization", nullptr},
      {"model.apply_layernorm_1p", "--apply-layernorm-1p", nullptr},
      {"model.position_embedding_type", "--position-embedding-type", nullptr},
      {"model.rotary_percent", "--rotary-percent", nullptr},
      {"model.rotary_base", "--rotary-base", nullptr},
      {"model.rotary_interleaved", "--rotary-interleaved", nullptr},
      {"model.add_bias_linear", "--disable-bias-linear (biases of the linear layers)", nullptr},
      {"model.add_qkv_bias", "--add-qkv-bias", nullptr},
      {"model.swiglu", "--swiglu", nullptr},
      {"model.squared_relu", "--squared-relu", nullptr},
      {"model.untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights", nullptr},
      {"model.qk_layernorm", "--qk-layernorm", nullptr},
  };
  return keys;
}

namespace {

// The value at a dotted path ("model.layernorm_epsilon"), or nullptr.
const json* at_path(const json& j, const std::string& path) {
  const json* cur = &j;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(path.substr(start, dot - start));
    if (it == cur->end() || it->is_null()) return nullptr;
    cur = &*it;
    start = dot + 1;
  }
  return cur;
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    // Floats are recorded through float fields: equal to float precision.
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::fabs(x - y) <= 1e-6 * std::max(std::fabs(x), std::fabs(y));
  }
  return a == b;
}

}  // namespace

void check_model_function_args(const CheckpointOnDisk& ckpt, const TrainingArgs& args) {
  const std::string where = (ckpt.dir / "metadata.json").string();
  const json given = training_args_to_json(args), defaults = training_args_to_json(TrainingArgs{});
  std::vector<std::string> overridden;
  for (const ModelSettingKey& k : model_function_keys()) {
    const json* d = at_path(defaults, k.path);
    const json fallback = !k.old_default.is_null() ? k.old_default : d ? *d : json();
    const json* s = at_path(ckpt.state.args, k.path);
    const json* g = at_path(given, k.path);
    const json saved = s ? *s : fallback, mine = g ? *g : fallback;
    if (saved.is_null() || mine.is_null() || same_value(saved, mine)) continue;
    const std::string what = str(k.flag, ": the checkpoint ", where, " was trained with ", k.path,
                                 " = ", saved.dump(), s ? "" : " (not recorded: the default then)",
                                 " but this run gives ", mine.dump());
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
