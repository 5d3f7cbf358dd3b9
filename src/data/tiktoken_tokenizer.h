// TikTokenizer: Megatron's CustomTikTokenizer (--tokenizer-type TikTokenizer), a tiktoken-style
// byte-level BPE from a ranks file (--tokenizer-model) with Megatron's id layout:
//  - ids 0 .. num_special-1 are special tokens: --tokenizer-special-tokens (default <unk> <s>
//    </s>; must include those three), then <SPECIAL_k> fillers up to
//    --tiktoken-num-special-tokens (default 1000);
//  - the rank-r token has id r + num_special; the ranks are cut to the first
//    vocab_size - num_special (--vocab-size, default 131072);
//  - encode is tiktoken's encode_ordinary with --tiktoken-pattern v1 or v2 (special-token strings
//    in the text are ordinary text); decode writes special tokens as their strings and repairs
//    invalid UTF-8 with U+FFFD; EOD = EOS = </s>, BOS = <s>, no pad.
// Invalid UTF-8 in the text (which tiktoken cannot be given) is encoded as raw bytes: the pattern
// never matches an invalid byte and no match crosses one; each run of invalid bytes is a piece.
// The ranks file is Megatron's JSON (a list of {"rank", "token_bytes" (base64), "token_str"}) or
// tiktoken's text form (one "BASE64 RANK" line per token, e.g. cl100k_base.tiktoken).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace megatron::data {

class ByteBPE;
class RegexSplitter;

// Megatron's PATTERN_TIKTOKEN ("v1") and PATTERN_TIKTOKEN_V2 ("v2").
const std::string& tiktoken_pattern(const std::string& name);

// Reads a ranks file (either form): the token bytes in rank order. Throws megatron::Error naming
// `flag`, the file and the line/entry at fault.
std::vector<std::string> read_tiktoken_ranks(const std::string& path, const char* flag);

class TikTokenizer final : public Tokenizer {
 public:
  struct Options {
    std::string ranks_file;  // --tokenizer-model
    std::string pattern;     // --tiktoken-pattern: v1 | v2
    int64_t vocab_size = 0;  // --vocab-size (0: Megatron's fallback 131072)
    int num_special_tokens = 1000;            // --tiktoken-num-special-tokens
    std::vector<std::string> special_tokens;  // --tokenizer-special-tokens (empty: the default)
  };
  explicit TikTokenizer(const Options& options);
  ~TikTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return eos_; }
  std::optional<int32_t> eos() const override { return eos_; }
  std::optional<int32_t> bos() const override { return bos_; }
  std::string type() const override { return "TikTokenizer"; }
  int32_t unk() const { return unk_; }
  // The raw bytes of an id (a special token's string for ids below num_special).
  const std::string& token_bytes(int32_t id) const;

 private:
  std::unique_ptr<ByteBPE> bpe_;
  std::unique_ptr<RegexSplitter> regex_;
  std::vector<std::string> id_bytes_;
  int64_t vocab_size_ = 0;
  int32_t unk_ = 0, bos_ = 0, eos_ = 0;
};

}  // namespace megatron::data
