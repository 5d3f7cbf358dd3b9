// Byte-level BPE engine shared by TikTokenizer and HuggingFaceTokenizer: turns one pre-tokenized
// piece (raw bytes) into token ids. Two merge rules:
//  - ranks (tiktoken): the vocabulary is a list of byte strings ordered by rank; a piece that is
//    itself a token is that token; otherwise, starting from single bytes, the adjacent pair whose
//    concatenation has the lowest rank is merged (leftmost on a tie) until no concatenation is a
//    token (tiktoken's byte_pair_merge);
//  - merges (Hugging Face tokenizers' BPE model): an explicit list of (left, right) merges; the
//    pair with the lowest merge rank is merged (leftmost on a tie) until none applies; with
//    `ignore_merges` a piece that is itself a token is that token (Llama-3's tokenizer.json).
// Pieces up to 64 bytes merge with a quadratic scan (fastest for words); longer ones (runs of
// digits, code, base64) with a heap of candidate pairs, O(n log n), same result. Results are
// cached per thread (piece -> ids), per engine instance.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace megatron::data {

struct TransparentStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using BytesToId =
    std::unordered_map<std::string, int32_t, TransparentStringHash, std::equal_to<>>;

class ByteBPE {
 public:
  // Rank rule: token_bytes[r] is the token of rank r, with id r + id_offset. Every single byte
  // must be a token (checked by the caller, who knows the file to name).
  static std::unique_ptr<ByteBPE> from_ranks(std::vector<std::string> token_bytes, int32_t id_offset);
  // Merge rule: `vocab` maps token bytes to ids; merges[k] = (left id, right id) of rank k, whose
  // merged token must be in `vocab` (the caller checks and names the file line).
  static std::unique_ptr<ByteBPE> from_merges(BytesToId vocab,
                                              const std::vector<std::pair<int32_t, int32_t>>& merges,
                                              bool ignore_merges);
  ~ByteBPE();

  // Appends the ids of one piece.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // Id of a byte string that is a whole token, if any.
  std::optional<int32_t> token_id(std::string_view bytes) const;
  // Id of a single byte (always present).
  int32_t byte_id(uint8_t b) const { return byte_id_[b]; }

 private:
  struct Sym {
    uint32_t start, end;
    int32_t id;
  };
  struct PairTable;
  struct Found {
    uint32_t rank;
    int32_t id;
  };
  ByteBPE();
  std::optional<Found> pair(std::string_view piece, const Sym& a, const Sym& b) const;
  void merge_short(std::string_view piece, std::vector<Sym>& sym) const;
  void merge_long(std::string_view piece, std::vector<Sym>& sym) const;

  bool ranks_ = true;
  bool whole_piece_first_ = true;
  BytesToId token_id_;  // bytes -> id (ranks: also the rank, id - id_offset_)
  int32_t id_offset_ = 0;
  int32_t byte_id_[256] = {};
  std::unique_ptr<PairTable> merges_;
  uint64_t instance_ = 0;
};

}  // namespace megatron::data
