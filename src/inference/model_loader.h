// Builds what generation needs from Megatron-style arguments: the tokenizer, and the model with
// the weights of a checkpoint (--load), run by the generation engine (gpt_engine.h). The
// architecture comes from the model flags (or the checkpoint's recorded arguments, see
// cli/inference_flags.h), as with Megatron's tools/run_text_generation_server.py; the
// checkpoint's tensors must match it exactly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "data/tokenizer.h"
#include "inference/gpt_engine.h"
#include "model/transformer_config.h"

namespace megatron::inference {

struct InferenceModelOptions {
  std::string load;                   // --load
  std::optional<int64_t> ckpt_step;   // --ckpt-step
  model::TransformerConfig model;     // from the model flags; padded_vocab_size filled by load
  int64_t make_vocab_size_divisible_by = 128;
  data::TokenizerOptions tokenizer;
  Device device = Device::cpu();      // where the model and its KV cache live (--device)
};

struct InferenceModel {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<GPTEngine> model;
  int64_t iteration = 0;
};

// Throws megatron::Error naming the flag, file or tensor at fault.
InferenceModel load_inference_model(const InferenceModelOptions& options);

// Megatron-Core checkpoints of the Transformer Engine spec keep each norm inside the next linear
// (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_bias, ...): renames those to the local
// spec's input_layernorm / pre_mlp_layernorm names the model uses.
std::map<std::string, Tensor> with_local_norm_names(std::map<std::string, Tensor> weights);

}  // namespace megatron::inference
