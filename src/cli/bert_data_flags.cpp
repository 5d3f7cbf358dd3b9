// See bert_data_flags.h.
#include "cli/bert_data_flags.h"

namespace megatron::cli {

void add_masking_flags(CLI::App& sub, double& mask_prob, double& short_seq_prob) {
  sub.add_option("--mask-prob", mask_prob, "Probability of masking a token (BERT: [MASK] and replacements; T5: "
                                           "spans replaced by sentinels)")
      ->capture_default_str();
  sub.add_option("--short-seq-prob", short_seq_prob,
                 "Probability of a sample shorter than the sequence length (BERT, T5)")
      ->capture_default_str();
}

void add_bert_data_flags(CLI::App& sub, megatron::data::BertDataConfig& c) {
  add_masking_flags(sub, c.mask_prob, c.short_seq_prob);
  sub.add_flag("--bert-binary-head,!--bert-no-binary-head", c.binary_head,
               "BERT's sentence-order (binary) head and its segment pairs (default on; "
               "--bert-no-binary-head: one segment, samples of any sentence count)");
}

void add_t5_length_flags(CLI::App& sub, megatron::data::T5DataConfig& c) {
  sub.add_option("--encoder-seq-length", c.encoder_seq_length,
                 "T5: encoder sequence length (text with sentinels; --seq-length is an alias)");
  sub.add_option("--decoder-seq-length", c.decoder_seq_length,
                 "T5: decoder sequence length ([BOS], sentinels and the masked spans)");
}

void add_t5_data_flags(CLI::App& sub, megatron::data::T5DataConfig& c) {
  add_masking_flags(sub, c.mask_prob, c.short_seq_prob);
  add_t5_length_flags(sub, c);
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
