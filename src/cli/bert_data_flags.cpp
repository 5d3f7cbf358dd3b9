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

void add_dataset_flags(CLI::App& sub, megatron::data::GPTDataConfig& d, const std::string& help_prefix) {
  sub.add_option("--data-path", d.data_path, help_prefix + "[WEIGHT] PREFIX ... blend");
  sub.add_option("--train-data-path", d.train_data_path, help_prefix + "[WEIGHT] PREFIX ...");
  sub.add_option("--valid-data-path", d.valid_data_path, help_prefix + "[WEIGHT] PREFIX ...");
  sub.add_option("--test-data-path", d.test_data_path, help_prefix + "[WEIGHT] PREFIX ...");
  sub.add_option("--split", d.split, help_prefix + "train,valid,test proportions")->capture_default_str();
  sub.add_option("--data-cache-path", d.data_cache_path, help_prefix + "Index cache folder");
}

}  // namespace megatron::cli
