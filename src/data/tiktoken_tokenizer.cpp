// TikTokenizer (Megatron's CustomTikTokenizer); see tiktoken_tokenizer.h.
#include "data/tiktoken_tokenizer.h"

#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/error.h"
#include "data/byte_bpe.h"
#include "data/file_text.h"
#include "data/regex_splitter.h"
#include "data/unicode.h"

namespace megatron::data {

namespace {

constexpr int64_t kDefaultVocabSize = int64_t(1) << 17;  // Megatron's fallback

// Standard base64 (with or without '=' padding); nullopt on any other character.
std::optional<std::string> base64_decode(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xFF);
    }
  }
  if (bits >= 6) return std::nullopt;  // a lone trailing character carries no whole byte
  return out;
}

}  // namespace

const std::string& tiktoken_pattern(const std::string& name) {
  static const std::string v1 =
      R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
  static const std::string v2 =
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|)"
      R"( ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (name == "v1") return v1;
  if (name == "v2") return v2;
  MG_THROW("--tiktoken-pattern must be v1 or v2 (Megatron's PATTERN_TIKTOKEN and "
           "PATTERN_TIKTOKEN_V2), got '", name, "'");
}

std::vector<std::string> read_tiktoken_ranks(const std::string& path, const char* flag) {
  const std::string text = read_file_for_flag(path, flag);
  std::vector<std::string> tokens;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    // Megatron's JSON form (reload_mergeable_ranks): entry i has rank i.
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      MG_THROW(flag, " '", path, "' line ", line_at_offset(text, e.byte), ": not valid JSON (",
               e.what(), ")");
    }
    MG_REQUIRE(j.is_array(), flag, " '", path, "' must be a JSON list of {rank, token_bytes, token_str}");
    for (size_t i = 0; i < j.size(); ++i) {
      const auto& e = j[i];
      MG_REQUIRE(e.is_object() && e.contains("rank") && e.contains("token_bytes") &&
                     e["rank"].is_number_integer() && e["token_bytes"].is_string(),
                 flag, " '", path, "' entry ", i,
                 ": expected {\"rank\": int, \"token_bytes\": base64, \"token_str\": ...}, got ",
                 e.dump().substr(0, 200));
      MG_REQUIRE(e["rank"].get<int64_t>() == int64_t(i), flag, " '", path, "' entry ", i,
                 " has rank ", e["rank"].get<int64_t>(), "; entries must be in rank order 0, 1, ...");
      auto bytes = base64_decode(e["token_bytes"].get<std::string>());
      MG_REQUIRE(bytes && !bytes->empty(), flag, " '", path, "' entry ", i,
                 ": token_bytes is not non-empty base64");
      tokens.push_back(std::move(*bytes));
    }
  } else {
    // tiktoken's text form: "BASE64 RANK" per line, ranks 0..N-1 in any order.
    std::vector<std::optional<std::string>> by_rank;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      auto bytes = sp == std::string_view::npos ? std::nullopt : base64_decode(line.substr(0, sp));
      int64_t rank = -1;
      if (sp != std::string_view::npos) {
        std::string_view r = line.substr(sp + 1);
        rank = r.empty() || r.size() > 9 ? -1 : 0;
        for (char c : r) rank = rank >= 0 && c >= '0' && c <= '9' ? rank * 10 + (c - '0') : -1;
      }
      MG_REQUIRE(bytes && !bytes->empty() && rank >= 0, flag, " '", path, "' line ", line_no,
                 ": expected 'BASE64 RANK' (a .tiktoken ranks file), got '",
                 line.substr(0, 120), "'");
      if (size_t(rank) >= by_rank.size()) by_rank.resize(size_t(rank) + 1);
      MG_REQUIRE(!by_rank[size_t(rank)], flag, " '", path, "' line ", line_no, ": rank ", rank,
                 " appears twice");
      by_rank[size_t(rank)] = std::move(*bytes);
    }
    for (size_t r = 0; r < by_rank.size(); ++r) {
      MG_REQUIRE(by_rank[r].has_value(), flag, " '", path, "': rank ", r,
                 " is missing (ranks must be 0, 1, ..., N-1)");
      tokens.push_back(std::move(*by_rank[r]));
    }
  }
  MG_REQUIRE(!tokens.empty(), flag, " '", path, "' holds no tokens");
  std::unordered_set<std::string_view> seen;
  for (size_t r = 0; r < tokens.size(); ++r)
    MG_REQUIRE(seen.insert(tokens[r]).second, flag, " '", path, "': the token of rank ", r,
               " repeats an earlier token");
  return tokens;
}

TikTokenizer::TikTokenizer(const Options& o) {
  MG_REQUIRE(!o.ranks_file.empty(),
             "--tokenizer-type TikTokenizer needs --tokenizer-model (a tiktoken ranks file: "
             "Megatron's JSON list or a .tiktoken file)");
  MG_REQUIRE(!o.pattern.empty(), "--tokenizer-type TikTokenizer needs --tiktoken-pattern v1 or v2");
  const std::string& pattern = tiktoken_pattern(o.pattern);
  vocab_size_ = o.vocab_size > 0 ? o.vocab_size : kDefaultVocabSize;
  MG_REQUIRE(vocab_size_ <= (int64_t(1) << 30), "--vocab-size ", vocab_size_, " is too large");

  std::vector<std::string> specials = o.special_tokens;
  if (specials.empty()) specials = {"<unk>", "<s>", "</s>"};
  std::unordered_set<std::string> unique(specials.begin(), specials.end());
  MG_REQUIRE(unique.size() == specials.size(), "--tokenizer-special-tokens must be unique");
  for (const char* needed : {"<unk>", "<s>", "</s>"})
    MG_REQUIRE(unique.count(needed), "--tokenizer-special-tokens must include <unk>, <s> and </s> "
               "(TikTokenizer's unk, bos and eos); '", needed, "' is missing");
  const int64_t num_special = o.num_special_tokens;
  MG_REQUIRE(int64_t(specials.size()) <= num_special && num_special < vocab_size_,
             "--tiktoken-num-special-tokens ", num_special, " must be at least the ",
             specials.size(), " special tokens and below the vocabulary size ", vocab_size_);
  for (int64_t i = int64_t(specials.size()); i < num_special; ++i)
    specials.push_back("<SPECIAL_" + std::to_string(i) + ">");

  std::vector<std::string> ranks = read_tiktoken_ranks(o.ranks_file, "--tokenizer-model");
  const int64_t inner = vocab_size_ - num_special;
  MG_REQUIRE(int64_t(ranks.size()) >= inner, "TikTokenizer: --vocab-size ", vocab_size_,
             " needs ", inner, " ranks after the ", num_special,
             " special tokens, but --tokenizer-model '", o.ranks_file, "' has ", ranks.size(),
             "; pass --vocab-size ", int64_t(ranks.size()) + num_special, " or less");
  ranks.resize(size_t(inner));
  // Every single byte must be a token (Megatron's own files put byte b at rank b; tiktoken's
  // cl100k_base and o200k_base order them differently, which is fine).
  std::vector<bool> byte_seen(256, false);
  for (const std::string& t : ranks)
    if (t.size() == 1) byte_seen[uint8_t(t[0])] = true;
  for (int b = 0; b < 256; ++b)
    MG_REQUIRE(byte_seen[size_t(b)], "--tokenizer-model '", o.ranks_file, "': byte ", b,
               " is not among the first ", inner,
               " ranks; a byte-level tiktoken vocabulary needs all 256 single bytes");
  const std::unordered_set<std::string_view> special_set(specials.begin(), specials.end());
  for (int64_t r = 0; r < inner; ++r)
    MG_REQUIRE(!special_set.count(ranks[size_t(r)]), "TikTokenizer: special token '",
               ranks[size_t(r)], "' is also an ordinary token (rank ", r, ")");

  id_bytes_ = specials;
  id_bytes_.insert(id_bytes_.end(), ranks.begin(), ranks.end());
  for (size_t i = 0; i < specials.size(); ++i) {
    if (specials[i] == "<unk>") unk_ = int32_t(i);
    if (specials[i] == "<s>") bos_ = int32_t(i);
    if (specials[i] == "</s>") eos_ = int32_t(i);
  }
  bpe_ = ByteBPE::from_ranks(std::move(ranks), int32_t(num_special));
  regex_ = std::make_unique<RegexSplitter>(pattern, "--tiktoken-pattern " + o.pattern);
}

TikTokenizer::~TikTokenizer() = default;

void TikTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  regex_->split(text, [&](std::string_view piece, bool) { bpe_->encode_piece(piece, out); });
}

const std::string& TikTokenizer::token_bytes(int32_t id) const {
  MG_REQUIRE(id >= 0 && id < vocab_size_, "TikTokenizer: cannot decode id ", id,
             ", outside the vocabulary [0, ", vocab_size_, ")");
  return id_bytes_[size_t(id)];
}

std::string TikTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);
  return unicode::repair_utf8(bytes);
}

}  // namespace megatron::data
