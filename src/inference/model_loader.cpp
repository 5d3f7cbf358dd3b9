// Tokenizer + checkpoint weights -> GPT engine.
#include "inference/model_loader.h"

#include "core/error.h"
#include "core/log.h"
#include "inference/checkpoint_weights.h"

namespace megatron::inference {

InferenceModel load_inference_model(const InferenceModelOptions& options) {
  MG_REQUIRE(!options.load.empty(), "--load is required: the checkpoint folder to generate with");
  MG_REQUIRE(!options.tokenizer.type.empty(), "--tokenizer-type is required");
  InferenceModel out;
  out.tokenizer = data::build_tokenizer(options.tokenizer);
  GPTInferenceConfig cfg = options.gpt;
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
  out.model = std::make_unique<GPTInference>(
      cfg, [&weights](const std::string& name) { return weights.get(name); });
  log_info("loaded checkpoint ", weights.directory().string(), " (iteration ", out.iteration,
           "): ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", vocab ", padded);
  return out;
}

}  // namespace megatron::inference
