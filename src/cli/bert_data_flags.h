// Megatron's BERT data flags (--mask-prob, --short-seq-prob, --bert-no-binary-head and its
// explicit opposite --bert-binary-head), added to every subcommand that builds BERT samples so
// they are spelled, defaulted and documented once.
#pragma once

#include <CLI/CLI.hpp>

#include "data/bert_dataset.h"

namespace megatron::cli {

// Adds the flags to `sub`, writing into `c` (defaults as pretrain_bert.py: 0.15, 0.1, binary head on).
void add_bert_data_flags(CLI::App& sub, megatron::data::BertDataConfig& c);

}  // namespace megatron::cli
