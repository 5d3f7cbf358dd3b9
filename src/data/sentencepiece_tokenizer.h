// SentencePiece tokenizers (Megatron's --tokenizer-type SentencePieceTokenizer,
// GPTSentencePieceTokenizer and Llama2Tokenizer), from a SentencePiece model file
// (--tokenizer-model, e.g. Llama-2's tokenizer.model) through Debian's libsentencepiece.
//
// The three types differ only in Megatron's wrapper around the same processor:
//  - SentencePieceTokenizer: the model's pieces, then special tokens appended unless the model
//    already has them: <CLS>, <SEP>, <EOD>, <MASK>, the pad/bos/eos pieces (<PAD>, <BOS>, <EOS>
//    when the model has none), and <extra_id_0..N-1> (--vocab-extra-ids). encode splits the text
//    at every occurrence of a special-token string (earliest first; on a tie, the one added
//    first) and encodes the pieces between them separately; decode writes each special token as
//    " TOKEN " between the decoded runs. EOD = <EOD>.
//  - GPTSentencePieceTokenizer: the model's ids as they are; encode/decode are the processor's;
//    EOD = EOS = the model's eos id.
//  - Llama2Tokenizer: as GPTSentencePieceTokenizer, but encode prepends BOS to every text (Meta's
//    "text completion" default, which Megatron's preprocess-data and generation use).
// vocab_size() is the model's piece count (plus the added specials for SentencePieceTokenizer).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace megatron::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  enum class Flavor { kSentencePiece, kGPTSentencePiece, kLlama2 };

  // Throws megatron::Error naming --tokenizer-model when the file is missing or not a model.
  SentencePieceTokenizer(const std::string& model_file, Flavor flavor, int vocab_extra_ids = 0);
  ~SentencePieceTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return eod_; }
  std::optional<int32_t> pad() const override { return pad_; }
  std::optional<int32_t> bos() const override { return bos_; }
  std::optional<int32_t> eos() const override { return eos_; }
  std::optional<int32_t> cls() const override { return cls_; }
  std::optional<int32_t> sep() const override { return sep_; }
  std::optional<int32_t> mask() const override { return mask_; }
  std::string type() const override;

  // The piece string of an id (model pieces and added special tokens).
  std::string piece(int32_t id) const;
  // Ids of <extra_id_0>, <extra_id_1>, ... (SentencePieceTokenizer with --vocab-extra-ids).
  const std::vector<int32_t>& extra_ids() const { return extra_ids_; }

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  std::string decode_plain(std::span<const int32_t> ids) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  Flavor flavor_;
  int32_t pieces_ = 0;  // the model's piece count
  int64_t vocab_size_ = 0;
  std::vector<std::string> added_;  // pieces of ids pieces_, pieces_ + 1, ...
  // Special tokens in the order Megatron adds them (the tie-break order of encode).
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::unordered_map<int32_t, std::string> special_of_id_;
  std::vector<int32_t> extra_ids_;
  std::optional<int32_t> eod_, pad_, bos_, eos_, cls_, sep_, mask_;
};

}  // namespace megatron::data
