// Builds what generation needs from Megatron-style arguments: the tokenizer, and the GPT engine
// with the weights of a checkpoint (--load). The architecture comes from the model flags, as
// with Megatron's tools/run_text_generation_server.py; the checkpoint's tensors must match it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/tokenizer.h"
#include "inference/gpt_inference.h"

namespace megatron::inference {

struct InferenceModelOptions {
  std::string load;                   // --load
  std::optional<int64_t> ckpt_step;   // --ckpt-step
  GPTInferenceConfig gpt;             // from the model flags; padded_vocab_size filled by load
  int64_t make_vocab_size_divisible_by = 128;
  data::TokenizerOptions tokenizer;
};

struct InferenceModel {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<GPTInference> model;
  int64_t iteration = 0;
};

// Throws megatron::Error naming the flag, file or tensor at fault.
InferenceModel load_inference_model(const InferenceModelOptions& options);

}  // namespace megatron::inference
