// Tokenizer + checkpoint weights -> the generation engine over the model's own layers.
#include "inference/model_loader.h"

#include "core/error.h"
#include "core/log.h"
#include "inference/checkpoint_weights.h"

namespace megatron::inference {

std::map<std::string, Tensor> with_local_norm_names(std::map<std::string, Tensor> w) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : w) {
    std::string n = name;
    for (const auto& [fused, local] :
         {std::pair<std::string, std::string>{".self_attention.linear_qkv.layer_norm_", ".input_layernorm."},
          {".mlp.linear_fc1.layer_norm_", ".pre_mlp_layernorm."}}) {
      const size_t at = n.find(fused);
      if (at != std::string::npos) n = n.substr(0, at) + local + n.substr(at + fused.size());
    }
    MG_REQUIRE(!out.count(n), "the checkpoint has both ", name, " and ", n,
               " (the same norm under two names)");
    out.emplace(n, std::move(t));
  }
  return out;
}

InferenceModel load_inference_model(const InferenceModelOptions& options) {
  MG_REQUIRE(!options.load.empty(), "--load is required: the checkpoint folder to generate with");
  MG_REQUIRE(!options.tokenizer.type.empty(), "--tokenizer-type is required");
  InferenceModel out;
  out.tokenizer = data::build_tokenizer(options.tokenizer);
  model::TransformerConfig cfg = options.model;
  const int64_t padded =
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, 1);
  cfg.padded_vocab_size = padded;
  const auto weights = CheckpointWeights::open(options.load, options.ckpt_step, padded);
  out.iteration = weights.iteration();
  const Tensor emb = weights.get("embedding.word_embeddings.weight");
  MG_REQUIRE(emb.defined(), "checkpoint ", weights.directory().string(),
             " has no embedding.word_embeddings.weight; is it a GPT checkpoint?");
  MG_REQUIRE(emb.dim() == 2 && emb.size(0) == padded, "the checkpoint's vocabulary has ",
             emb.size(0), " rows but the tokenizer (", out.tokenizer->vocab_size(),
             " tokens, --make-vocab-size-divisible-by ", options.make_vocab_size_divisible_by,
             ") pads to ", padded, "; use the tokenizer flags the model was trained with");
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : weights.names()) tensors.emplace(n, weights.get(n));
  auto engine = std::make_unique<GPTEngine>(cfg, with_local_norm_names(std::move(tensors)),
                                            options.device);
  log_info("loaded checkpoint ", weights.directory().string(), " (iteration ", out.iteration,
           "): ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", vocab ", padded,
           "; weights in ", dtype_name(cfg.params_dtype), ", ", engine->model().weight_bytes(),
           " bytes");
  out.model = std::move(engine);
  return out;
}

}  // namespace megatron::inference
