// Megatron's model, tokenizer and checkpoint flags for the commands that load a model for
// generation (generate, serve). The model flags are the training ones (model_flags.h); finish()
// resolves them into the loader's options after parsing.
//
// --use-checkpoint-args (as Megatron's) takes the model settings from the checkpoint's
// metadata.json "args" (ours, or Megatron's flat arguments; model/model_settings.h lists every
// setting): the shape (num_layers, hidden_size, num_attention_heads must be there unless given as
// flags), norms, activation, position embeddings, attention, biases, output layer, and
// max_position_embeddings / seq_length and make_vocab_size_divisible_by. A flag given on the
// command line must agree with the checkpoint (an error names both values); settings the
// checkpoint lacks keep the flags' values. Without --use-checkpoint-args, a checkpoint that has
// metadata is still checked: a flag, or a default left alone, that describes a different model
// than the checkpoint's is an error naming it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "cli/megatron_compat.h"
#include "cli/model_flags.h"
#include "cli/tokenizer_options.h"
#include "inference/model_loader.h"

namespace megatron::inference {
class CheckpointArgs;
}

namespace megatron::cli {

struct InferenceFlags {
  inference::InferenceModelOptions options;  // load, tokenizer, vocabulary padding
  ModelFlags model;
  int64_t ckpt_step = -1;
  bool use_checkpoint_args = false;
  // Megatron's flags of the tools that load a model for inference (run_text_generation_server.py,
  // tasks/main.py): the parallel sizes must be 1 (shards merged in memory) or the checkpoint's;
  // --fp16/--bf16 keep the weights in that precision in memory (half the fp32 bytes; each
  // module's fp32 working copy exists only while it runs, model/gpt_model.h ModelOptions::grad):
  // the products, norms and softmax compute in fp32 from the rounded weights, and the KV cache is
  // bf16 with bf16 weights on the CPU, fp32 otherwise (Megatron computes the activations in half
  // as well);
  // --no-load-optim/--no-load-rng are what inference does anyway (weights only).
  int tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  bool fp16 = false, bf16 = false;
  bool no_load_optim = false, no_load_rng = false;
  std::string device;  // --device: cuda | cpu | "" (a GPU when one is present)
  // evaluate: a BERT checkpoint's metadata is accepted (its family, binary head and bidirectional
  // attention are taken into the model); generate and serve refuse it.
  bool accept_bert = false;
  // generate, serve, evaluate: a T5 checkpoint's metadata is accepted (its family is taken into
  // the model, and with --use-checkpoint-args its --vocab-extra-ids).
  bool accept_t5 = false;
  CompatFlags compat;
  // The rest of Megatron's shared flags; the command adds them after its own
  // (add_megatron_flags), finish() checks them.
  MegatronFlags megatron;

  void add(CLI::App& sub);
  // Resolves the flags (and, with --use-checkpoint-args, the checkpoint's arguments) into the
  // loader's options. Throws megatron::Error naming the flag at fault.
  inference::InferenceModelOptions finish();

 private:
  // Applies a checkpoint's arguments to `cfg` (--use-checkpoint-args), or with check_only (no
  // --use-checkpoint-args, metadata present) checks that the model `cfg` describes is the
  // checkpoint's, and changes nothing.
  void apply_checkpoint_args(model::TransformerConfig& cfg, const inference::CheckpointArgs& ck,
                             bool check_only);
  void apply_t5_checkpoint_args(const inference::CheckpointArgs& ck, bool check_only);
  bool given(const std::string& flag) const { return model.given(flag); }
  CLI::App* app_ = nullptr;
};

// Megatron's inference-tool flags above (parallel sizes, precision, load switches, the kernel
// flags of megatron_compat.h): added by InferenceFlags::add, checked first by finish() (the
// parallel sizes against the checkpoint's mp_rank_* folders). See inference_compat.cpp.
void add_inference_compat_flags(CLI::App& sub, InferenceFlags& f);
void check_inference_compat_flags(const CLI::App& sub, const InferenceFlags& f,
                                  std::optional<int64_t> step);

}  // namespace megatron::cli
