// Tokenizers: text <-> token ids, Megatron's `--tokenizer-type` choices.
// Every tokenizer is immutable after construction and safe to use from many threads at once
// (preprocess-data encodes in parallel with one shared instance).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to `out`.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }
  // Text of a sequence of ids (invalid UTF-8 from partial byte tokens becomes U+FFFD, as
  // Megatron's errors='replace'). Ids outside the vocabulary throw megatron::Error.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The text of one token as Megatron's "segments" show it (decode of that id alone).
  virtual std::string token_text(int32_t id) const { return decode(std::span(&id, 1)); }
  // Byte-level tokenizers: the raw bytes of one token, possibly part of a UTF-8 character (the
  // concatenation over a sequence is the text before repair). nullopt for other tokenizers.
  virtual std::optional<std::string> token_raw_bytes(int32_t) const { return std::nullopt; }
  // Vocabulary size before padding (Megatron's tokenizer.vocab_size).
  virtual int64_t vocab_size() const = 0;
  // Special ids; nullopt where the tokenizer has none.
  virtual std::optional<int32_t> eod() const { return std::nullopt; }
  virtual std::optional<int32_t> pad() const { return std::nullopt; }
  virtual std::optional<int32_t> cls() const { return std::nullopt; }
  virtual std::optional<int32_t> sep() const { return std::nullopt; }
  virtual std::optional<int32_t> mask() const { return std::nullopt; }
  virtual std::optional<int32_t> bos() const { return std::nullopt; }
  virtual std::optional<int32_t> eos() const { return std::nullopt; }
  // The --tokenizer-type name.
  virtual std::string type() const = 0;
  // The EOD id, or a clear error naming the tokenizer when it has none.
  int32_t eod_or_throw() const;
};

// Flags of Megatron's tokenizer group.
struct TokenizerOptions {
  std::string type;         // --tokenizer-type
  std::string vocab_file;   // --vocab-file
  std::string merge_file;   // --merge-file
  std::string tokenizer_model;  // --tokenizer-model (SentencePiece model, tokenizer.json, ranks)
  int64_t vocab_size = 0;   // --vocab-size (NullTokenizer; TikTokenizer, 0 = 131072)
  int vocab_extra_ids = 0;  // --vocab-extra-ids
  std::string tiktoken_pattern;                     // --tiktoken-pattern v1|v2 (TikTokenizer)
  int tiktoken_num_special_tokens = 1000;           // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;          // --tokenizer-special-tokens (TikTokenizer)
};

// Builds the tokenizer the options name; throws megatron::Error naming the flag or file at fault.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options);

// Megatron's vocab padding: round up to a multiple of divisible_by * tensor_parallel_size.
int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel_size);

// NullTokenizer: "tokenizes" whitespace-separated integer ids (Megatron core semantics:
// vocab_size as given, EOD = vocab_size - 1). Used for tests and benchmarks.
class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size);
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return int32_t(vocab_size_ - 1); }
  std::string type() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_;
};

}  // namespace megatron::data
