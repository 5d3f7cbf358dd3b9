// The flags of `megatron pretrain-gpt` (Megatron-LM's pretrain_gpt.py names and defaults) and
// their resolution into training::TrainingArgs, shared by the commands that take a training run's
// command line: pretrain-gpt itself and plan (which sizes the run without building it).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <memory>

#include "cli/bert_data_flags.h"
#include "cli/megatron_compat.h"
#include "cli/model_flags.h"
#include "cli/moe_flags.h"
#include "training/trainer.h"

namespace megatron::cli {

// pretrain-t5's own flags (Megatron's names and defaults; pretrain_t5.cpp).
struct T5Flags {
  // (--decoder-num-layers and the relative-attention sizes are model settings: ModelFlags)
  int encoder_num_layers = 0;
  // --encoder-seq-length, --decoder-seq-length, --mask-prob, --short-seq-prob (the data
  // library's flags, bert_data_flags.h)
  data::T5DataConfig data;
};
void add_t5_flags(CLI::App& sub, T5Flags& f);
// Megatron's validate_args for an encoder-decoder model: --num-layers or --encoder-num-layers
// (one of them), --seq-length or --encoder-seq-length (one of them), --decoder-seq-length
// required; the T5 family into a.model.
void apply_t5_flags(const T5Flags& f, const ModelFlags& model, training::TrainingArgs& a);

struct PretrainFlags {
  training::TrainingArgs a;
  ModelFlags model;
  MoeFlags moe;  // the mixture-of-experts flags (written into model.config)
  bool recompute_activations = false, checkpoint_activations = false;
  bool accumulate_allreduce_grads_in_fp32 = false;
  double decoupled_lr = std::numeric_limits<double>::quiet_NaN();
  double decoupled_min_lr = std::numeric_limits<double>::quiet_NaN();
  int64_t batch_size = 0, warmup = 0, model_parallel_size = 0;  // Megatron's removed flags
  CompatFlags compat;
  MegatronFlags megatron;
  CLI::App* app = nullptr;
  // --device cuda|cpu (where the run computes); plan has a --device of its own (the hardware
  // its search sizes the run for) and turns this one off.
  bool device_flag = true;
  // pretrain-bert (pretrain_bert.py): the BERT family and its data flags.
  bool bert = false;
  data::BertDataConfig bert_data;
  // pretrain-t5 (pretrain_t5.py): the T5 family and its flags (pretrain_t5.cpp).
  bool t5 = false;
  T5Flags t5_flags;
};

// Registers the shared training flags of pretrain-gpt and pretrain-bert on `sub`, writing into *f (which must outlive the parse).
void add_pretrain_flags(CLI::App& sub, PretrainFlags* f);
// After parsing: the TrainingArgs the flags describe (Megatron's removed flags and contradictory
// ones refused with megatron::Error naming them; the model's architecture resolved; tokenizer
// paths made absolute). Prints the notes pretrain-gpt prints.
training::TrainingArgs resolve_pretrain_flags(PretrainFlags f);

}  // namespace megatron::cli
