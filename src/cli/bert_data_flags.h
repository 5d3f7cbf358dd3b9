// Megatron's masked-data flags, added to every subcommand that builds BERT or T5 samples so they
// are spelled, defaulted and documented once: --mask-prob and --short-seq-prob (both families),
// --bert-no-binary-head and its explicit opposite --bert-binary-head (BERT),
// --encoder-seq-length and --decoder-seq-length (T5).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "data/bert_dataset.h"
#include "data/t5_dataset.h"
#include "data/data_builder.h"

namespace megatron::cli {

// --mask-prob and --short-seq-prob (defaults as Megatron: 0.15, 0.1).
void add_masking_flags(CLI::App& sub, double& mask_prob, double& short_seq_prob);

// The masking flags and the binary head (default on), writing into `c`.
void add_bert_data_flags(CLI::App& sub, megatron::data::BertDataConfig& c);

// --encoder-seq-length and --decoder-seq-length, writing into `c` (the masking flags are added
// separately where BERT's are already there).
void add_t5_length_flags(CLI::App& sub, megatron::data::T5DataConfig& c);

// The masking flags and the T5 lengths, writing into `c` (pretrain-t5).
void add_t5_data_flags(CLI::App& sub, megatron::data::T5DataConfig& c);
// The dataset flags of the commands that rebuild pretraining's samples outside training
// (inspect-data --samples, evaluate on a BERT checkpoint): --data-path (a blend), the per-split
// --train/valid/test-data-path, --split and --data-cache-path, into `d`; `help_prefix` starts
// each help text.
void add_dataset_flags(CLI::App& sub, megatron::data::GPTDataConfig& d, const std::string& help_prefix = "");

}  // namespace megatron::cli
