// See bert_data_flags.h.
#include "cli/bert_data_flags.h"

namespace megatron::cli {

void add_bert_data_flags(CLI::App& sub, megatron::data::BertDataConfig& c) {
  sub.add_option("--mask-prob", c.mask_prob, "Probability of replacing a token with [MASK] (BERT)")
      ->capture_default_str();
  sub.add_option("--short-seq-prob", c.short_seq_prob, "Probability of a sample shorter than --seq-length (BERT)")
      ->capture_default_str();
  sub.add_flag("--bert-binary-head,!--bert-no-binary-head", c.binary_head,
               "BERT's sentence-order (binary) head and its segment pairs (default on; "
               "--bert-no-binary-head: one segment, samples of any sentence count)");
}

}  // namespace megatron::cli
