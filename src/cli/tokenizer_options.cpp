// Megatron's tokenizer flag group; see tokenizer_options.h.
#include "cli/tokenizer_options.h"

namespace megatron::cli {

CLI::Option* add_tokenizer_options(CLI::App& sub, megatron::data::TokenizerOptions& o) {
  CLI::Option* type = sub.add_option("--tokenizer-type", o.type,
                                     "Tokenizer type: GPT2BPETokenizer, BertWordPieceLowerCase, "
                                     "BertWordPieceCase, NullTokenizer");
  sub.add_option("--vocab-file", o.vocab_file,
                 "Vocabulary file (GPT-2: encoder JSON; BERT: one token per line)");
  sub.add_option("--merge-file", o.merge_file, "BPE merge file (GPT2BPETokenizer)");
  sub.add_option("--tokenizer-model", o.tokenizer_model, "Tokenizer model file");
  sub.add_option("--vocab-size", o.vocab_size, "Vocabulary size (NullTokenizer)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--vocab-extra-ids", o.vocab_extra_ids,
                 "Number of <extra_id_k> tokens added to the vocabulary (BERT/T5)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  return type;
}

}  // namespace megatron::cli
