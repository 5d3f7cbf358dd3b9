// Megatron's tokenizer flag group; see tokenizer_options.h.
#include "cli/tokenizer_options.h"

namespace megatron::cli {

CLI::Option* add_tokenizer_options(CLI::App& sub, megatron::data::TokenizerOptions& o) {
  CLI::Option* type = sub.add_option(
      "--tokenizer-type", o.type,
      "Tokenizer type: GPT2BPETokenizer, BertWordPieceLowerCase, BertWordPieceCase, "
      "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, HuggingFaceTokenizer, "
      "TikTokenizer, NullTokenizer");
  sub.add_option("--vocab-file", o.vocab_file,
                 "Vocabulary file (GPT-2: encoder JSON; BERT: one token per line)");
  sub.add_option("--merge-file", o.merge_file, "BPE merge file (GPT2BPETokenizer)");
  sub.add_option("--tokenizer-model", o.tokenizer_model,
                 "SentencePiece model (SentencePieceTokenizer, GPTSentencePieceTokenizer, "
                 "Llama2Tokenizer), tokenizer.json or its folder (HuggingFaceTokenizer), or ranks "
                 "file (TikTokenizer: Megatron's JSON or .tiktoken)");
  sub.add_option("--vocab-size", o.vocab_size,
                 "Vocabulary size (NullTokenizer; TikTokenizer, default 131072)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--vocab-extra-ids", o.vocab_extra_ids,
                 "Number of <extra_id_k> tokens added to the vocabulary (BERT, SentencePiece)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--tiktoken-pattern", o.tiktoken_pattern,
                 "TikTokenizer pre-tokenizer pattern: v1 or v2 (Megatron's)");
  sub.add_option("--tiktoken-num-special-tokens", o.tiktoken_num_special_tokens,
                 "TikTokenizer: number of special-token ids before the ranks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--tokenizer-special-tokens,--tiktoken-special-tokens", o.special_tokens,
                 "TikTokenizer special tokens (must include <unk> <s> </s>; default those three)");
  return type;
}

}  // namespace megatron::cli
