// GPT2BPETokenizer: OpenAI GPT-2's byte-level BPE (Megatron's --tokenizer-type GPT2BPETokenizer),
// from an encoder JSON (--vocab-file, token string -> id) and a merges file (--merge-file).
//
// encode = GPT-2's Encoder.encode and tiktoken's gpt2 `encode_ordinary`:
//  1. pre-tokenize with GPT-2's regex
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     implemented as a hand-written UTF-8 scanner (\s = Unicode White_Space; contractions are
//     lower-case only; a whitespace run followed by a non-space leaves its last character to
//     the next piece);
//  2. apply BPE merges by rank to each piece's bytes (all occurrences of the best pair per
//     round, as GPT-2's bpe(); a heap-based O(n log n) variant for long pieces), with a
//     per-thread cache of piece -> ids.
// Special-token strings such as "<|endoftext|>" in the text are encoded as ordinary text, as
// Megatron's GPT-2 tokenizer does (it never parses specials); EOD is appended by the caller.
// Invalid UTF-8 in the input (which GPT-2 and tiktoken cannot receive, since they take decoded
// strings) is tokenized bytewise: each invalid byte is a character of its own in the
// "[^\s\p{L}\p{N}]" class, so it joins punctuation runs; decode(encode(x)) == x for any bytes.
// decode concatenates the tokens' bytes and repairs invalid UTF-8 with U+FFFD
// (errors='replace').
// The merges file is validated against the vocabulary: every token other than the 256 bytes and
// special tokens ("<...>") must be made by a merge of earlier tokens, so an empty or truncated
// merges file is an error instead of tokenizing into several times as many tokens.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace megatron::data {

class GPT2BPETokenizer final : public Tokenizer {
 public:
  // Throws megatron::Error naming the file (and line, for the merges file) when a file is
  // missing or malformed.
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);
  ~GPT2BPETokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  // The raw bytes of a token (may be a partial UTF-8 sequence).
  const std::string& token_bytes(int32_t id) const;
  std::optional<std::string> token_raw_bytes(int32_t id) const override { return token_bytes(id); }
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return eod_; }
  std::string type() const override { return "GPT2BPETokenizer"; }

  // The pre-tokenizer alone: splits `text` into GPT-2's regex pieces (exposed for tests).
  static std::vector<std::string_view> pretokenize(std::string_view text);

 private:
  struct MergeTable;
  void check_merges_cover_vocabulary(const std::vector<std::array<int32_t, 3>>& merges,
                                     const std::string& merge_file, const std::string& vocab_file) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_short(std::string_view piece) const;
  std::vector<int32_t> merge_long(std::string_view piece) const;

  int64_t vocab_size_ = 0;
  std::optional<int32_t> eod_;
  int32_t byte_id_[256];
  std::vector<std::string> id_bytes_;  // id -> raw bytes ("" with has_id_ false for holes)
  std::vector<bool> has_id_;
  std::unique_ptr<MergeTable> merges_;
  uint64_t instance_;  // distinguishes instances in the per-thread cache
};

}  // namespace megatron::data
