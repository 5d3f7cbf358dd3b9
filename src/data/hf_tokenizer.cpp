// HuggingFaceTokenizer from tokenizer.json; see hf_tokenizer.h for what is supported.
#include "data/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/input_bounds.h"
#include "data/byte_bpe.h"
#include "data/file_text.h"
#include "data/regex_splitter.h"
#include "data/unicode.h"

namespace megatron::data {

namespace fs = std::filesystem;
using nlohmann::json;

struct HuggingFaceTokenizer::Normalizer {
  enum Kind { kNFC, kNFD, kNFKC, kNFKD, kLowercase, kReplace, kPrepend } kind;
  std::string from, to;  // Replace: from -> to; Prepend: to
};

struct HuggingFaceTokenizer::PreTokenizer {
  enum Kind { kByteLevel, kSplit } kind = kByteLevel;
  bool add_prefix_space = false;
  enum Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext } behavior = kIsolated;
  std::shared_ptr<RegexSplitter> regex;  // ByteLevel with use_regex, or Split
};

struct HuggingFaceTokenizer::AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, single_word;
};

namespace {

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 where none.
const std::vector<int>& unicode_to_byte() {
  static const std::vector<int> inv = [] {
    std::vector<int> v(324, -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      v[printable ? b : 256 + extra++] = b;
    }
    return v;
  }();
  return inv;
}

// A token string in the byte-to-unicode alphabet -> its bytes; nullopt if any character is
// outside it (the tokenizers crate's ByteLevel decoder then keeps the token's own UTF-8).
std::optional<std::string> byte_level_bytes(std::string_view s) {
  const auto& inv = unicode_to_byte();
  std::string out;
  for (size_t i = 0; i < s.size();) {
    int len;
    const int32_t cp = unicode::decode_utf8(s, i, len);
    if (cp < 0 || cp >= int32_t(inv.size()) || inv[size_t(cp)] < 0) return std::nullopt;
    out += char(inv[size_t(cp)]);
    i += size_t(len);
  }
  return out;
}

// Length of the Unicode White_Space character ending at text[end-1] (0 if none).
size_t space_before(std::string_view text, size_t end) {
  for (size_t len = 1; len <= 3 && len <= end; ++len) {
    int l;
    const int32_t cp = unicode::decode_utf8(text, end - len, l);
    if (cp >= 0 && size_t(l) == len)
      return unicode::char_class(cp) == unicode::CharClass::kSpace ? len : 0;
  }
  return 0;
}

size_t space_at(std::string_view text, size_t i) {
  int l;
  const int32_t cp = unicode::decode_utf8(text, i, l);
  return cp >= 0 && unicode::char_class(cp) == unicode::CharClass::kSpace ? size_t(l) : 0;
}

bool word_char(int32_t cp) {
  const auto c = unicode::char_class(cp);
  return cp == '_' || c == unicode::CharClass::kLetter || c == unicode::CharClass::kNumber;
}

// A literal string as a regex: ASCII punctuation escaped (PCRE2 treats an escaped
// non-alphanumeric as itself), everything else as it is.
std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = uint8_t(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// A token given as a string or as {"content": ...} (tokenizer_config.json).
std::optional<std::string> token_string(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return std::nullopt;
}

// Limits on what a tokenizer.json may ask for: a real one nests about 6 levels deep and chains a
// few normalizers and pre-tokenizers, whose output is at most a few times longer than the text.
constexpr int kMaxJsonDepth = 32;
constexpr size_t kMaxSteps = 32;            // normalizers, and pre-tokenizers, after flattening
constexpr size_t kMaxExpansion = 64;        // normalized text <= 64 x the text + 4 KiB
constexpr size_t kExpansionSlack = 4096;

json parse_json_file(const std::string& path, const char* what) {
  const std::string text = read_file_for_flag(path, "--tokenizer-model");
  return parse_json_bounded(text, str(what, " '", path, "'"), kMaxJsonDepth);
}

// The tokens no merge can make, in order: a token counts as made once a merge joins two parts
// that are single bytes or were made by earlier merges. The tokens of a trained BPE all are (in
// training order); a merges list cut short, reordered or from another vocabulary leaves tokens no
// encoding can produce, and text then splits into several times as many tokens. Merges whose
// parts are made only later are allowed (converters from tiktoken ranks list every split of a
// token) as long as each token also has one in order. `exempt` ids (added and special tokens)
// need no merge.
void check_merges_reach_vocabulary(const BytesToId& vocab,
                                   const std::vector<std::array<int32_t, 3>>& merges,
                                   const std::vector<bool>& exempt, const std::string& where) {
  std::vector<bool> made(exempt.size(), false);
  for (const auto& [bytes, id] : vocab)
    if (bytes.size() == 1) made[size_t(id)] = true;
  for (const auto& m : merges)
    if (made[size_t(m[0])] && made[size_t(m[1])]) made[size_t(m[2])] = true;
  std::vector<std::string> missing;
  size_t count = 0;
  for (const auto& [bytes, id] : vocab) {
    if (made[size_t(id)] || exempt[size_t(id)]) continue;
    if (bytes.size() >= 3 && bytes.front() == '<' && bytes.back() == '>') continue;  // special
    if (++count <= 5) missing.push_back("'" + bytes + "'");
  }
  if (count == 0) return;
  std::sort(missing.begin(), missing.end());
  std::string examples;
  for (const auto& m : missing) examples += (examples.empty() ? "" : ", ") + m;
  MG_THROW(where, "model.merges (", merges.size(), " merges) makes none of ", count,
           " vocabulary tokens (for example ", examples, ") from parts made before it: the merges "
           "are cut short, out of order or from another vocabulary (text would split into far "
           "more tokens); use the tokenizer.json the model was trained with");
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path) try {
  MG_REQUIRE(!path.empty(), "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model "
             "(a tokenizer.json file or the folder holding it)");
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  MG_REQUIRE(fs::is_regular_file(file), "--tokenizer-model '", path, "': ", file.string(),
             " does not exist; HuggingFaceTokenizer reads a local tokenizer.json (download the "
             "model's tokenizer files first)");
  file_ = file.string();
  const json j = parse_json_file(file_, "tokenizer.json");
  auto where = [&](const std::string& field) { return "--tokenizer-model '" + file_ + "' " + field; };
  MG_REQUIRE(j.is_object(), where(""), "is not a JSON object");

  // ---- model
  MG_REQUIRE(j.contains("model") && j["model"].is_object(), where("has no \"model\" object"));
  const json& m = j["model"];
  const std::string model_type = m.value("type", m.contains("merges") ? "BPE" : "");
  MG_REQUIRE(model_type == "BPE", where("model type '"), model_type,
             "' is not supported: HuggingFaceTokenizer reads byte-level BPE models (GPT-2, "
             "Llama-3, Qwen); for SentencePiece models use --tokenizer-type Llama2Tokenizer or "
             "GPTSentencePieceTokenizer with the tokenizer.model file");
  MG_REQUIRE(!m.value("byte_fallback", false), where("model.byte_fallback"),
             " is true: a SentencePiece-style BPE, not byte-level; use Llama2Tokenizer or "
             "GPTSentencePieceTokenizer with the model's tokenizer.model");
  MG_REQUIRE(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"] == 0,
             where("model.dropout"), " is set; BPE dropout is not supported for preprocessing");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    MG_REQUIRE(!m.contains(k) || m[k].is_null() || m[k] == "", where("model."), k,
               " is not supported (byte-level BPE has none)");
  MG_REQUIRE(m.contains("vocab") && m["vocab"].is_object(), where("model.vocab must be an object"));
  BytesToId vocab;
  std::vector<std::pair<std::string, int32_t>> names;  // every token string -> id
  int64_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    MG_REQUIRE(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                   it.value().get<int64_t>() < (int64_t(1) << 24),
               where("model.vocab token '"), it.key(), "' must map to an id in [0, 2^24)");
    const int32_t id = it.value().get<int32_t>();
    max_id = std::max<int64_t>(max_id, id);
    names.emplace_back(it.key(), id);
    if (auto bytes = byte_level_bytes(it.key())) vocab.emplace(*bytes, id);
  }
  {
    std::vector<std::pair<int32_t, std::string>> by_id;
    by_id.reserve(names.size());
    for (const auto& [name, id] : names) by_id.emplace_back(id, name);
    std::sort(by_id.begin(), by_id.end());
    for (size_t k = 1; k < by_id.size(); ++k)
      MG_REQUIRE(by_id[k].first != by_id[k - 1].first, where("model.vocab"), " gives id ",
                 by_id[k].first, " to two tokens, '", by_id[k - 1].second, "' and '",
                 by_id[k].second, "': every token needs its own id (corrupted file)");
  }
  for (int b = 0; b < 256; ++b)
    MG_REQUIRE(vocab.count(std::string(1, char(b))), where("model.vocab"),
               " has no token for byte ", b, "; HuggingFaceTokenizer needs a byte-level vocabulary");
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<std::array<int32_t, 3>> merged_ids;  // left, right, merged
  std::unordered_map<uint64_t, size_t> merge_row;  // (left, right) -> first row
  static const json kNoMerges = json::array();
  const json& merges_json = m.contains("merges") ? m["merges"] : kNoMerges;
  MG_REQUIRE(merges_json.is_array(), where("model.merges must be a list"));
  for (size_t r = 0; r < merges_json.size(); ++r) {
    const json& e = merges_json[r];
    std::string parts[2];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      MG_REQUIRE(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                 where("model.merges["), r, "] '", s, "' is not two tokens separated by a space");
      parts[0] = s.substr(0, sp);
      parts[1] = s.substr(sp + 1);
    } else {
      MG_REQUIRE(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                 where("model.merges["), r, "] must be \"a b\" or [\"a\", \"b\"]");
      parts[0] = e[0].get<std::string>();
      parts[1] = e[1].get<std::string>();
    }
    int32_t ids[2];
    std::string joined;
    for (int k = 0; k < 2; ++k) {
      auto bytes = byte_level_bytes(parts[k]);
      auto it = bytes ? vocab.find(*bytes) : vocab.end();
      MG_REQUIRE(it != vocab.end(), where("model.merges["), r, "]: token '", parts[k],
                 "' is not in model.vocab");
      ids[k] = it->second;
      joined += *bytes;
    }
    const auto made = vocab.find(joined);
    MG_REQUIRE(made != vocab.end(), where("model.merges["), r, "]: the merged token '", parts[0],
               parts[1], "' is not in model.vocab");
    const auto [first, fresh] =
        merge_row.emplace((uint64_t(uint32_t(ids[0])) << 32) | uint32_t(ids[1]), r);
    MG_REQUIRE(fresh, where("model.merges["), r, "] '", parts[0], " ", parts[1],
               "' repeats model.merges[", first->second, "]: a repeated merge changes the ranks "
               "(corrupted or hand-edited file)");
    merges.emplace_back(ids[0], ids[1]);
    merged_ids.push_back({ids[0], ids[1], made->second});
  }
  const bool ignore_merges = m.value("ignore_merges", false);

  // ---- added tokens
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& t : j["added_tokens"]) {
      MG_REQUIRE(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
                     t.contains("content") && t["content"].is_string(),
                 where("added_tokens entry "), t.dump().substr(0, 120), " needs id and content");
      AddedToken a{t["content"].get<std::string>(), t["id"].get<int32_t>(), t.value("lstrip", false),
                   t.value("rstrip", false), t.value("single_word", false)};
      MG_REQUIRE(a.id >= 0 && a.id < (1 << 24) && !a.content.empty(), where("added token '"),
                 a.content, "' has an invalid id or empty content");
      max_id = std::max<int64_t>(max_id, a.id);
      names.emplace_back(a.content, a.id);
      added_.push_back(std::move(a));
    }
  }
  {  // the merges checked once the added tokens (which need none) are known
    std::vector<bool> exempt(size_t(max_id) + 1, false);
    for (const AddedToken& a : added_) exempt[size_t(a.id)] = true;
    check_merges_reach_vocabulary(vocab, merged_ids, exempt, where(""));
  }
  bpe_ = ByteBPE::from_merges(std::move(vocab), merges, ignore_merges);
  added_by_first_byte_.assign(256, {});
  for (size_t k = 0; k < added_.size(); ++k)
    added_by_first_byte_[uint8_t(added_[k].content[0])].push_back(k);
  for (auto& list : added_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return added_[a].content.size() > added_[b].content.size();
    });

  // ---- normalizer
  auto add_normalizer = [&](const json& n, auto&& self) -> void {
    if (n.is_null()) return;
    const std::string t = n.value("type", "");
    MG_REQUIRE(normalizers_.size() < kMaxSteps, where("normalizer"), " has more than ", kMaxSteps,
               " steps (the limit; a real tokenizer has a few)");
    if (t == "Sequence") {
      if (const auto c = n.find("normalizers"); c != n.end() && c->is_array())
        for (const json& step : *c) self(step, self);
    } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD" || t == "Lowercase") {
      const Normalizer::Kind k = t == "NFC" ? Normalizer::kNFC : t == "NFD" ? Normalizer::kNFD
                                 : t == "NFKC" ? Normalizer::kNFKC : t == "NFKD" ? Normalizer::kNFKD
                                 : Normalizer::kLowercase;
      normalizers_.push_back({k, "", ""});
    } else if (t == "Replace" && n.contains("pattern") && n["pattern"].contains("String")) {
      normalizers_.push_back({Normalizer::kReplace, n["pattern"]["String"].get<std::string>(),
                              n.value("content", "")});
      MG_REQUIRE(!normalizers_.back().from.empty(), where("normalizer Replace"), " has an empty pattern");
    } else if (t == "Prepend") {
      normalizers_.push_back({Normalizer::kPrepend, "", n.value("prepend", "")});
    } else {
      MG_THROW(where("normalizer "), n.dump().substr(0, 200),
               " is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Replace with a String "
               "pattern, Prepend, Sequence)");
    }
  };
  if (j.contains("normalizer")) add_normalizer(j["normalizer"], add_normalizer);

  // ---- pre-tokenizer
  auto add_pre = [&](const json& p, auto&& self) -> void {
    if (p.is_null()) return;
    const std::string t = p.value("type", "");
    MG_REQUIRE(pre_tokenizers_.size() < kMaxSteps, where("pre_tokenizer"), " has more than ",
               kMaxSteps, " steps (the limit; a real tokenizer has a few)");
    if (t == "Sequence") {
      if (const auto c = p.find("pretokenizers"); c != p.end() && c->is_array())
        for (const json& step : *c) self(step, self);
    } else if (t == "ByteLevel") {
      PreTokenizer s;
      s.kind = PreTokenizer::kByteLevel;
      s.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true))
        s.regex = std::make_shared<RegexSplitter>(kGpt2Pattern, where("ByteLevel regex"));
      pre_tokenizers_.push_back(std::move(s));
    } else if (t == "Split") {
      PreTokenizer s;
      s.kind = PreTokenizer::kSplit;
      MG_REQUIRE(!p.value("invert", false), where("pre_tokenizer Split"), " with invert is not supported");
      const std::string b = p.value("behavior", "Isolated");
      if (b == "Isolated") s.behavior = PreTokenizer::kIsolated;
      else if (b == "Removed") s.behavior = PreTokenizer::kRemoved;
      else if (b == "MergedWithPrevious") s.behavior = PreTokenizer::kMergedWithPrevious;
      else if (b == "MergedWithNext") s.behavior = PreTokenizer::kMergedWithNext;
      else MG_THROW(where("pre_tokenizer Split behavior '"), b, "' is not supported");
      const json pat = p.value("pattern", json::object());
      if (pat.contains("Regex") && pat["Regex"].is_string())
        s.regex = std::make_shared<RegexSplitter>(pat["Regex"].get<std::string>(),
                                                  where("pre_tokenizer Split pattern"));
      else if (pat.contains("String") && pat["String"].is_string())
        s.regex = std::make_shared<RegexSplitter>(regex_escape(pat["String"].get<std::string>()),
                                                  where("pre_tokenizer Split pattern"));
      else
        MG_THROW(where("pre_tokenizer Split"), " needs pattern {\"Regex\": ...} or {\"String\": ...}");
      pre_tokenizers_.push_back(std::move(s));
    } else {
      MG_THROW(where("pre_tokenizer "), p.dump().substr(0, 200),
               " is not supported (ByteLevel, Split, Sequence of these)");
    }
  };
  if (j.contains("pre_tokenizer")) add_pre(j["pre_tokenizer"], add_pre);

  // ---- post-processor: the ids around every encoded text
  auto id_of_name = [&](const std::string& token) -> int32_t {
    for (const auto& [n, id] : names)
      if (n == token) return id;
    MG_THROW(where("post_processor"), " names token '", token, "', which is not in the vocabulary");
  };
  auto add_post = [&](const json& p, auto&& self) -> void {
    if (p.is_null()) return;
    const std::string t = p.value("type", "");
    if (t == "Sequence") {
      if (const auto c = p.find("processors"); c != p.end() && c->is_array())
        for (const json& step : *c) self(step, self);
    } else if (t == "ByteLevel") {
      // Offsets only.
    } else if (t == "TemplateProcessing") {
      const json single = p.value("single", json::array());
      MG_REQUIRE(single.is_array(), where("post_processor TemplateProcessing.single must be a list"));
      bool seen_a = false;
      for (const json& piece : single) {
        if (piece.contains("Sequence")) {
          seen_a = true;
          continue;
        }
        MG_REQUIRE(piece.contains("SpecialToken"), where("post_processor template piece "),
                   piece.dump(), " is neither SpecialToken nor Sequence");
        const std::string name = piece["SpecialToken"].value("id", "");
        const json specials = p.value("special_tokens", json::object());
        std::vector<int32_t> ids;
        if (specials.contains(name) && specials[name].contains("ids"))
          ids = specials[name]["ids"].get<std::vector<int32_t>>();
        else
          ids = {id_of_name(name)};
        auto& dst = seen_a ? suffix_ids_ : prefix_ids_;
        dst.insert(dst.end(), ids.begin(), ids.end());
      }
    } else if (t == "RobertaProcessing" || t == "BertProcessing") {
      MG_REQUIRE(p.contains("cls") && p.contains("sep"), where("post_processor "), t, " needs cls and sep");
      prefix_ids_.push_back(p["cls"][1].get<int32_t>());
      suffix_ids_.push_back(p["sep"][1].get<int32_t>());
    } else {
      MG_THROW(where("post_processor "), p.dump().substr(0, 200), " is not supported");
    }
  };
  if (j.contains("post_processor")) add_post(j["post_processor"], add_post);

  // ---- decoder: ByteLevel only (what byte-level BPE needs)
  auto check_decoder = [&](const json& d, auto&& self) -> void {
    if (d.is_null()) return;
    const std::string t = d.value("type", "");
    if (t == "Sequence") {
      if (const auto c = d.find("decoders"); c != d.end() && c->is_array())
        for (const json& step : *c) self(step, self);
      return;
    }
    MG_REQUIRE(t == "ByteLevel", where("decoder "), d.dump().substr(0, 200),
               " is not supported (byte-level BPE decodes with ByteLevel)");
  };
  if (j.contains("decoder")) check_decoder(j["decoder"], check_decoder);

  // ---- id -> bytes for decode, vocabulary size, token lookup
  id_bytes_.assign(size_t(max_id) + 1, std::string());
  has_id_.assign(size_t(max_id) + 1, false);
  for (const auto& [name, id] : names) {
    auto bytes = byte_level_bytes(name);
    id_bytes_[size_t(id)] = bytes ? *bytes : name;
    has_id_[size_t(id)] = true;
  }
  // len(tokenizer) counts token strings: an added token whose content is also a vocabulary
  // token counts once.
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end(),
                          [](const auto& a, const auto& b) { return a.first == b.first; }),
              names.end());
  vocab_size_ = int64_t(names.size());
  token_ids_ = std::move(names);

  // ---- special ids: tokenizer_config.json / special_tokens_map.json as AutoTokenizer reads them
  json config = json::object();
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path p = file.parent_path() / name;
    if (!fs::is_regular_file(p)) continue;
    const json c = parse_json_file(p.string(), name);
    if (c.is_object()) config.update(c);
  }
  auto special = [&](const char* key) -> std::optional<int32_t> {
    if (!config.contains(key)) return std::nullopt;
    auto s = token_string(config[key]);
    if (!s) return std::nullopt;
    auto id = token_to_id(*s);
    MG_REQUIRE(id.has_value(), "tokenizer config beside '", file_, "': ", key, " '", *s,
               "' is not a token of tokenizer.json");
    return id;
  };
  eos_ = special("eos_token");
  bos_ = special("bos_token");
  pad_ = special("pad_token");
  if (!config.contains("eos_token")) {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
      for (const auto& a : added_)
        if (a.content == name && !eos_) eos_ = a.id;
    }
  }
} catch (const json::exception& e) {
  // A field of the wrong JSON type somewhere the checks above do not name.
  MG_THROW("--tokenizer-model '", path, "': a field has the wrong type or is missing (", e.what(),
           "); the file is not a valid tokenizer.json");
} MG_CATCH_OUT_OF_MEMORY("--tokenizer-model '" + path + "'")

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

std::optional<int32_t> HuggingFaceTokenizer::token_to_id(const std::string& token) const {
  auto it = std::lower_bound(token_ids_.begin(), token_ids_.end(), token,
                             [](const auto& e, const std::string& t) { return e.first < t; });
  if (it == token_ids_.end() || it->first != token) return std::nullopt;
  return it->second;
}

void HuggingFaceTokenizer::pretokenize(size_t step, std::string_view piece,
                                       std::vector<int32_t>& out,
                                       std::deque<std::string>& arena) const {
  if (piece.empty()) return;
  if (step == pre_tokenizers_.size()) {
    bpe_->encode_piece(piece, out);
    return;
  }
  const PreTokenizer& p = pre_tokenizers_[step];
  if (p.kind == PreTokenizer::kByteLevel && p.add_prefix_space && piece[0] != ' ') {
    arena.push_back(" " + std::string(piece));
    piece = arena.back();
  }
  if (!p.regex) {
    pretokenize(step + 1, piece, out, arena);
    return;
  }
  if (p.kind == PreTokenizer::kByteLevel || p.behavior == PreTokenizer::kIsolated) {
    p.regex->split(piece, [&](std::string_view s, bool) { pretokenize(step + 1, s, out, arena); });
    return;
  }
  // Removed / MergedWithPrevious / MergedWithNext: pieces are built from matches and gaps.
  size_t open = 0;  // start of the piece being built
  size_t pos = 0;
  p.regex->split(piece, [&](std::string_view s, bool matched) {
    const size_t begin = size_t(s.data() - piece.data());
    const size_t end = begin + s.size();
    pos = end;
    if (!matched) return;
    if (p.behavior == PreTokenizer::kRemoved) {
      pretokenize(step + 1, piece.substr(open, begin - open), out, arena);
      open = end;
    } else if (p.behavior == PreTokenizer::kMergedWithPrevious) {
      pretokenize(step + 1, piece.substr(open, end - open), out, arena);
      open = end;
    } else {  // MergedWithNext: the match starts the next piece
      pretokenize(step + 1, piece.substr(open, begin - open), out, arena);
      open = begin;
    }
  });
  pretokenize(step + 1, piece.substr(open, pos - open), out, arena);
}

void HuggingFaceTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  std::deque<std::string> arena;
  if (!normalizers_.empty()) {
    std::string s(text);
    const size_t limit = kMaxExpansion * text.size() + kExpansionSlack;
    const auto check_size = [&](size_t n) {
      MG_REQUIRE(n <= limit, "--tokenizer-model '", file_, "': the normalizers expand a text of ",
                 text.size(), " bytes beyond ", limit, " bytes (the limit is ", kMaxExpansion,
                 " times the text plus ", kExpansionSlack, " bytes): check its Replace and "
                 "Prepend normalizers");
    };
    for (const Normalizer& n : normalizers_) {
      switch (n.kind) {
        case Normalizer::kNFC:
        case Normalizer::kNFD:
        case Normalizer::kNFKC:
        case Normalizer::kNFKD: {
          int options = UTF8PROC_STABLE;
          if (n.kind == Normalizer::kNFC || n.kind == Normalizer::kNFKC) options |= UTF8PROC_COMPOSE;
          else options |= UTF8PROC_DECOMPOSE;
          if (n.kind == Normalizer::kNFKC || n.kind == Normalizer::kNFKD) options |= UTF8PROC_COMPAT;
          // utf8proc refuses a text holding invalid UTF-8 as a whole; then each run of valid
          // UTF-8 is normalised on its own and the invalid bytes between them are kept.
          auto map = [&](std::string_view run, std::string& into) {
            utf8proc_uint8_t* mapped = nullptr;
            const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          utf8proc_ssize_t(run.size()), &mapped,
                                          utf8proc_option_t(options));
            if (len >= 0) into.append(reinterpret_cast<char*>(mapped), size_t(len));
            std::free(mapped);
            return len >= 0;
          };
          std::string r;
          if (map(s, r)) {
            s.swap(r);
            break;
          }
          r.clear();
          for (size_t i = 0; i < s.size();) {
            size_t j = i;
            int len;
            while (j < s.size() && unicode::decode_utf8(s, j, len) != unicode::kInvalid) j += size_t(len);
            if (j > i && !map(std::string_view(s).substr(i, j - i), r)) r.append(s, i, j - i);
            while (j < s.size() && unicode::decode_utf8(s, j, len) == unicode::kInvalid) r += s[j++];
            i = j;
          }
          s.swap(r);
          break;
        }
        case Normalizer::kLowercase: {
          std::string lower;
          for (size_t i = 0; i < s.size();) {
            int len;
            const int32_t cp = unicode::decode_utf8(s, i, len);
            if (cp < 0) lower += s[i];
            else unicode::append_utf8(lower, utf8proc_tolower(cp));
            i += size_t(len);
          }
          s.swap(lower);
          break;
        }
        case Normalizer::kReplace: {
          std::string r;
          size_t pos = 0;
          for (size_t f; (f = s.find(n.from, pos)) != std::string::npos; pos = f + n.from.size()) {
            r.append(s, pos, f - pos).append(n.to);
            check_size(r.size());
          }
          r.append(s, pos);
          s.swap(r);
          break;
        }
        case Normalizer::kPrepend:
          if (!s.empty()) s.insert(0, n.to);
          break;
      }
      check_size(s.size());
    }
    arena.push_back(std::move(s));
    text = arena.back();
  }
  pretokenize(0, text, out, arena);
}

void HuggingFaceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  size_t seg = 0;  // start of the text not yet encoded
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* hit = nullptr;
    if (!added_.empty()) {
      for (size_t k : added_by_first_byte_[uint8_t(text[pos])]) {
        const AddedToken& a = added_[k];
        if (text.compare(pos, a.content.size(), a.content) != 0) continue;
        if (a.single_word) {
          int len;
          if (pos > 0) {
            size_t back = 1;
            while (back < 4 && back < pos && (uint8_t(text[pos - back]) & 0xC0) == 0x80) ++back;
            const int32_t before = unicode::decode_utf8(text, pos - back, len);
            if (before >= 0 && word_char(before)) continue;
          }
          const size_t after = pos + a.content.size();
          if (after < text.size()) {
            const int32_t next = unicode::decode_utf8(text, after, len);
            if (next >= 0 && word_char(next)) continue;
          }
        }
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + hit->content.size();
    if (hit->lstrip) {
      for (size_t l; begin > seg && (l = space_before(text, begin)) > 0;) begin -= l;
    }
    if (hit->rstrip) {
      for (size_t l; end < text.size() && (l = space_at(text, end)) > 0;) end += l;
    }
    encode_segment(text.substr(seg, begin - seg), out);
    out.push_back(hit->id);
    seg = pos = end;
  }
  encode_segment(text.substr(seg), out);
  out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
}

std::string HuggingFaceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    MG_REQUIRE(id >= 0 && size_t(id) < has_id_.size() && has_id_[size_t(id)],
               "HuggingFaceTokenizer: cannot decode id ", id, ": not a token of '", file_, "'");
    bytes += id_bytes_[size_t(id)];
  }
  return unicode::repair_utf8(bytes);
}

}  // namespace megatron::data
