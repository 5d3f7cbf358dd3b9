// HuggingFaceTokenizer (Megatron's --tokenizer-type HuggingFaceTokenizer) from a local
// tokenizer.json (--tokenizer-model: the file, or a folder holding it), without Python: the
// byte-level BPE tokenizers of GPT-2, Llama-3, Qwen and tiktoken-derived models.
//
// What is read from tokenizer.json (anything else stops with an error naming the field):
//  - model: BPE with byte-level vocab/merges ("a b" strings or [a, b] pairs), ignore_merges;
//    dropout, byte_fallback and subword prefixes/suffixes are refused;
//  - normalizer: null, NFC, NFD, NFKC, NFKD, Lowercase, Replace (String pattern), Prepend, or a
//    Sequence of these;
//  - pre_tokenizer: ByteLevel (add_prefix_space, use_regex with GPT-2's pattern), Split (Regex or
//    String pattern; Isolated, Removed, MergedWithPrevious, MergedWithNext), Sequence; regexes
//    through PCRE2;
//  - added_tokens: matched in the raw text first (leftmost, longest), with lstrip/rstrip/
//    single_word; their ids are emitted as they are;
//  - post_processor: TemplateProcessing (the "single" template, e.g. Llama-3's BOS),
//    RobertaProcessing/BertProcessing, ByteLevel, Sequence: applied to every encode, as
//    transformers' tokenizer(text).input_ids that Megatron calls;
//  - decoder: ByteLevel (tokens' characters back to bytes; invalid UTF-8 becomes U+FFFD);
//    transformers' optional clean_up_tokenization_spaces is not applied, so decode(encode(x)) == x.
// Added tokens are matched in the raw text, also those marked "normalized" (which the tokenizers
// crate matches after normalization; the same unless the normalizer changes them).
// EOD/BOS/pad are the eos/bos/pad tokens of tokenizer_config.json (or special_tokens_map.json)
// beside tokenizer.json, as transformers' AutoTokenizer reads them; without either file the EOD
// is the first added token named <|endoftext|>, <|end_of_text|>, </s> or <eos>.
// vocab_size() = len(tokenizer): the vocabulary plus added tokens not in it.
// Invalid UTF-8 (which the tokenizers crate cannot be given) is encoded as raw bytes: the
// normalizers act on the runs of valid UTF-8 between invalid bytes, no regex match crosses an
// invalid byte, and each run of invalid bytes is a piece of its own for the byte-level BPE.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace megatron::data {

class ByteBPE;
class RegexSplitter;

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  explicit HuggingFaceTokenizer(const std::string& path);
  ~HuggingFaceTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return eos_; }
  std::optional<int32_t> eos() const override { return eos_; }
  std::optional<int32_t> bos() const override { return bos_; }
  std::optional<int32_t> pad() const override { return pad_; }
  std::string type() const override { return "HuggingFaceTokenizer"; }
  // Id of a token string (vocabulary or added token), if any.
  std::optional<int32_t> token_to_id(const std::string& token) const;

  struct Normalizer;
  struct PreTokenizer;
  struct AddedToken;

 private:
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void pretokenize(size_t step, std::string_view piece, std::vector<int32_t>& out,
                   std::deque<std::string>& arena) const;

  std::string file_;
  std::unique_ptr<ByteBPE> bpe_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;
  std::vector<AddedToken> added_;
  std::vector<std::vector<size_t>> added_by_first_byte_;  // 256 lists, longest first
  std::vector<int32_t> prefix_ids_, suffix_ids_;          // from the post-processor
  std::vector<std::string> id_bytes_;                     // id -> decoded bytes
  std::vector<bool> has_id_;
  std::vector<std::pair<std::string, int32_t>> token_ids_;  // sorted, for token_to_id
  int64_t vocab_size_ = 0;
  std::optional<int32_t> eos_, bos_, pad_;
};

}  // namespace megatron::data
