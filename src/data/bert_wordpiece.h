// BertWordPieceLowerCase / BertWordPieceCase: BERT's tokenizer as Megatron uses it
// (Google's bert_tokenization.FullTokenizer wrapped by Megatron's _BertWordPieceTokenizer).
//
// Basic tokenizer: drop NUL, U+FFFD and control characters (Cc/Cf except \t\n\r), map
// whitespace (\t\n\r, Zs) to spaces; put spaces around CJK ideographs; split on whitespace;
// for the lower-case variant lower-case each word (as Python's str.lower, incl. final sigma)
// and strip accents (NFD, drop Mn); split off every punctuation character (ASCII symbol
// ranges and Unicode P*).
// WordPiece: greedy longest-match-first with "##" continuation pieces; a word longer than 200
// code points (Google's max_input_chars_per_word) or with an unmatched rest becomes [UNK].
// Invalid UTF-8 bytes in the input are dropped (Python's decode(errors='ignore') in
// convert_to_unicode).
// Vocabulary: one token per line (stripped), id = line index. As Megatron does, [BOS] and [EOS]
// are appended when missing, then <extra_id_0..N-1> for --vocab-extra-ids N (both variants,
// as Megatron's training build_tokenizer passes the flag); EOD = [EOS].
// Special strings such as "[CLS]" in the text are not matched (they split on punctuation).
// decode joins tokens with spaces and glues "##" pieces on (convert_tokens_to_string).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace megatron::data {

class BertWordPieceTokenizer final : public Tokenizer {
 public:
  // Throws megatron::Error naming the file and line for a missing, non-UTF-8 or duplicate-token
  // vocabulary, or one without [UNK], [CLS], [SEP], [PAD], [MASK].
  BertWordPieceTokenizer(const std::string& vocab_file, bool lower_case, int vocab_extra_ids = 0);

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  std::optional<int32_t> eod() const override { return eos_; }
  std::optional<int32_t> pad() const override { return pad_; }
  std::optional<int32_t> cls() const override { return cls_; }
  std::optional<int32_t> sep() const override { return sep_; }
  std::optional<int32_t> mask() const override { return mask_; }
  std::optional<int32_t> bos() const override { return bos_; }
  std::optional<int32_t> eos() const override { return eos_; }
  std::string type() const override {
    return lower_case_ ? "BertWordPieceLowerCase" : "BertWordPieceCase";
  }
  // The ids of <extra_id_0> .. <extra_id_{N-1}> in that order (Megatron's
  // additional_special_tokens_ids: T5's sentinels); a token the file already holds keeps its id.
  const std::vector<int32_t>& extra_ids() const { return extra_ids_; }
  // The token string of an id (throws for ids outside the vocabulary).
  const std::string& token(int32_t id) const;

  // The basic tokenizer alone (words after cleaning, lower-casing and punctuation splitting).
  std::vector<std::string> basic_tokenize(std::string_view text) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  int32_t id_of(const std::string& path, const char* token) const;
  int32_t add_token(const std::string& token);
  void wordpiece(const std::string& word, std::vector<int32_t>& out) const;

  bool lower_case_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<int32_t> extra_ids_;
  int32_t unk_ = 0, cls_ = 0, sep_ = 0, pad_ = 0, mask_ = 0, bos_ = 0, eos_ = 0;
};

}  // namespace megatron::data
