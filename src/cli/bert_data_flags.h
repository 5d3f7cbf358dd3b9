// Megatron's BERT data flags (--mask-prob, --short-seq-prob, --bert-no-binary-head and its
// explicit opposite --bert-binary-head), added to every subcommand that builds BERT samples so
// they are spelled, defaulted and documented once.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "data/bert_dataset.h"
#include "data/data_builder.h"

namespace megatron::cli {

// Adds the flags to `sub`, writing into `c` (defaults as pretrain_bert.py: 0.15, 0.1, binary head on).
void add_bert_data_flags(CLI::App& sub, megatron::data::BertDataConfig& c);

// The dataset flags of the commands that rebuild pretraining's samples outside training
// (inspect-data --samples, evaluate on a BERT checkpoint): --data-path (a blend), the per-split
// --train/valid/test-data-path, --split and --data-cache-path, into `d`; `help_prefix` starts
// each help text.
void add_dataset_flags(CLI::App& sub, megatron::data::GPTDataConfig& d, const std::string& help_prefix = "");

}  // namespace megatron::cli
