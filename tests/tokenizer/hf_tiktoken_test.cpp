// HuggingFaceTokenizer and TikTokenizer on small hand-written files: each tokenizer.json
// feature (normalizers, Split behaviours, added-token lstrip/rstrip/single_word, templates),
// Megatron's flag checks, the regex translation, invalid UTF-8, and errors that name the file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/regex_splitter.h"
#include "data/tiktoken_tokenizer.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using megatron::testing::error_of;
using megatron::testing::TempDir;
using megatron::testing::write_file;
using nlohmann::json;

// GPT-2's byte-to-unicode character of a byte.
std::string byte_char(uint8_t b) {
  int extra = 0;
  for (int c = 0; c < 256; ++c) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    const int cp = printable ? c : 256 + extra++;
    if (c == b) {
      std::string s;
      if (cp < 0x80) s += char(cp);
      else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
      return s;
    }
  }
  return "";
}

// A byte-level BPE with the 256 byte tokens (id = byte) and merges for "ab", "abc", " a".
json tiny_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(uint8_t(b))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab[byte_char(' ') + "a"] = 258;
  return json{{"version", "1.0"},
              {"added_tokens", json::array({json{{"id", 300}, {"content", "<eos>"}, {"special", true}},
                                            json{{"id", 301}, {"content", "<L>"}, {"lstrip", true}},
                                            json{{"id", 302}, {"content", "<R>"}, {"rstrip", true}},
                                            json{{"id", 303}, {"content", "w"}, {"single_word", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "ab c", byte_char(' ') + " a"})}}}};
}

std::string save(const TempDir& dir, const json& j, const std::string& name = "tokenizer.json") {
  write_file(dir / name, j.dump());
  return (dir / name).string();
}

TEST(HuggingFaceTokenizer, MergesAddedTokensAndStripping) {
  TempDir dir;
  HuggingFaceTokenizer tok(save(dir, tiny_tokenizer()));
  EXPECT_EQ(tok.encode("abc ab a"), (std::vector<int32_t>{257, ' ', 256, 258}));
  // <eos> is matched anywhere; <L> takes the spaces before it, <R> those after it.
  EXPECT_EQ(tok.encode("x<eos>y"), (std::vector<int32_t>{'x', 300, 'y'}));
  EXPECT_EQ(tok.encode("x  <L>  y"), (std::vector<int32_t>{'x', 301, ' ', ' ', 'y'}));
  EXPECT_EQ(tok.encode("x  <R>  y"), (std::vector<int32_t>{'x', ' ', ' ', 302, 'y'}));
  // single_word "w": only as a word of its own.
  EXPECT_EQ(tok.encode("a w b"), (std::vector<int32_t>{'a', ' ', 303, ' ', 'b'}));
  EXPECT_EQ(tok.encode("awb"), (std::vector<int32_t>{'a', 'w', 'b'}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{257, 300, 258}), "abc<eos> a");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{303, 'w'}), "ww");
  EXPECT_EQ(tok.vocab_size(), 259 + 3);  // the added "w" is also a vocabulary string
  EXPECT_EQ(*tok.eod(), 300);  // no tokenizer_config.json: the <eos> added token
  // Invalid UTF-8 survives byte for byte; decode repairs it with U+FFFD.
  const std::string bad = "a\xff\xfe b\xc3";
  const auto ids = tok.encode(bad);
  std::string bytes;
  for (int32_t id : ids) bytes += char(id);
  EXPECT_EQ(bytes, bad);
  EXPECT_EQ(tok.decode(ids), "a\xEF\xBF\xBD\xEF\xBF\xBD b\xEF\xBF\xBD");
}

TEST(HuggingFaceTokenizer, NormalizersSplitBehavioursTemplateAndConfig) {
  TempDir dir;
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({json{{"type", "NFC"}}, json{{"type", "Lowercase"}},
                                                  json{{"type", "Replace"}, {"pattern", {{"String", "x"}}}, {"content", "ab"}}})}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}},
                                                       json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}})}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({json{{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}},
                                                 json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                 json{{"SpecialToken", {{"id", "<R>"}, {"type_id", 0}}}}})},
                         {"special_tokens", json::object()}};
  save(dir, j);
  write_file(dir / "tokenizer_config.json", R"({"eos_token": {"content": "<R>"}, "bos_token": "<eos>"})");
  HuggingFaceTokenizer tok(dir.path().string());
  // NFC composes e + U+0301; Lowercase; Replace x -> ab; Split removes '-'; each piece gets a
  // prefix space; "a b" (rank 0) merges before " a" (rank 2).
  EXPECT_EQ(tok.encode("AB-X-e\xCC\x81"),
            (std::vector<int32_t>{300, ' ', 256, ' ', 256, ' ', 0xC3, 0xA9, 302}));
  EXPECT_EQ(*tok.eod(), 302);
  EXPECT_EQ(*tok.bos(), 300);

  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "[0-9]"}}}, {"behavior", "MergedWithPrevious"}};
  j["post_processor"] = nullptr;
  j["normalizer"] = nullptr;
  HuggingFaceTokenizer prev(save(dir, j));
  EXPECT_EQ(prev.encode("ab1c2"), (std::vector<int32_t>{256, '1', 'c', '2'}));
  j["pre_tokenizer"]["behavior"] = "MergedWithNext";
  HuggingFaceTokenizer next(save(dir, j));
  EXPECT_EQ(next.encode("ab1c2"), (std::vector<int32_t>{256, '1', 'c', '2'}));
  EXPECT_EQ(next.encode("1ab"), (std::vector<int32_t>{'1', 256}));
}

TEST(HuggingFaceTokenizer, UnsupportedFilesAreRefusedWithTheField) {
  TempDir dir;
  json j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t(save(dir, j)); }).find("model type 'WordPiece' is not supported"),
            std::string::npos);
  j = tiny_tokenizer();
  j["model"]["byte_fallback"] = true;
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t(save(dir, j)); }).find("Llama2Tokenizer"), std::string::npos);
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t(save(dir, j)); }).find("pre_tokenizer"), std::string::npos);
  j = tiny_tokenizer();
  j["model"]["merges"] = json::array({"a zz"});
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t(save(dir, j)); }).find("merges[0]: token 'zz'"), std::string::npos);
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t(save(dir, j)); }).find("does not compile"), std::string::npos);
  write_file(dir / "broken.json", "{\n\"model\": [1, 2,\n");
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t((dir / "broken.json").string()); }).find("line 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { HuggingFaceTokenizer t((dir / "nothing").string()); }).find("does not exist"),
            std::string::npos);
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  EXPECT_NE(error_of([&] { build_tokenizer(o); }).find("needs --tokenizer-model"), std::string::npos);
}

// What a damaged or hostile tokenizer.json asks for is bounded or refused, never a crash, an
// internal error or gigabytes: nesting depth, the number of normalizer and pre-tokenizer steps, the
// normalizers' expansion of a text (errors naming each limit), duplicate ids, repeated merges, and
// merges cut short or reversed (as --merge-file refuses them).
TEST(HuggingFaceTokenizer, HostileAndDamagedFilesAreBoundedOrRefused) {
  TempDir dir;
  const auto error_for = [&](const json& j) {
    return error_of([&] { HuggingFaceTokenizer t(save(dir, j)); });
  };
  // A Sequence normalizer nested 4000 deep (1.9 MB of JSON; it once took 3.1 GB): refused while
  // parsing, at the depth limit.
  std::string deep = tiny_tokenizer().dump();
  std::string nest;
  for (int k = 0; k < 4000; ++k) nest += R"({"type": "Sequence", "normalizers": [)";
  nest += R"({"type": "NFC"})";
  for (int k = 0; k < 4000; ++k) nest += "]}";
  deep.replace(deep.find("\"normalizer\":null"), 17, "\"normalizer\":" + nest);
  write_file(dir / "deep.json", deep);
  std::string e = error_of([&] { HuggingFaceTokenizer t((dir / "deep.json").string()); });
  EXPECT_NE(e.find("JSON nested deeper than 32 levels (the limit"), std::string::npos) << e;
  EXPECT_NE(e.find("deep.json"), std::string::npos) << e;
  // Within the depth, at most 32 steps.
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int k = 0; k < 40; ++k) j["normalizer"]["normalizers"].push_back(json{{"type", "NFC"}});
  EXPECT_NE(error_for(j).find("normalizer has more than 32 steps (the limit"), std::string::npos);
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array()}};
  for (int k = 0; k < 40; ++k)
    j["pre_tokenizer"]["pretokenizers"].push_back(json{{"type", "ByteLevel"}, {"use_regex", false}});
  EXPECT_NE(error_for(j).find("pre_tokenizer has more than 32 steps (the limit"), std::string::npos);
  // Six chained Replace normalizers, each a -> 100 a's (once 2.4 GB, then bad_alloc): the
  // expansion limit is reached inside the first, with the text's size and the limit named.
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int k = 0; k < 6; ++k)
    j["normalizer"]["normalizers"].push_back(
        json{{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", std::string(100, 'a')}});
  HuggingFaceTokenizer expanding(save(dir, j));
  e = error_of([&] { expanding.encode(std::string(1000, 'a')); });
  EXPECT_NE(e.find("the normalizers expand a text of 1000 bytes beyond 68096 bytes (the limit is 64 "
                   "times the text plus 4096 bytes)"), std::string::npos) << e;
  EXPECT_EQ(expanding.encode("b").size(), 1u);  // what stays within the limit encodes
  // Two tokens with one id: an Error naming both (it was an internal error).
  j = tiny_tokenizer();
  j["model"]["vocab"]["zz"] = 257;
  e = error_for(j);
  EXPECT_NE(e.find("model.vocab gives id 257 to two tokens, 'abc' and 'zz'"), std::string::npos) << e;
  // A repeated merge.
  j = tiny_tokenizer();
  j["model"]["merges"].push_back("a b");
  e = error_for(j);
  EXPECT_NE(e.find("model.merges[3] 'a b' repeats model.merges[0]"), std::string::npos) << e;
  // Merges cut short: "abc" is made by none.
  j = tiny_tokenizer();
  j["model"]["merges"] = json::array({"a b", byte_char(' ') + " a"});
  e = error_for(j);
  EXPECT_NE(e.find("makes none of 1 vocabulary tokens (for example 'abc')"), std::string::npos) << e;
  EXPECT_NE(e.find("cut short, out of order or from another vocabulary"), std::string::npos) << e;
  j["model"]["merges"] = json::array();
  EXPECT_NE(error_for(j).find("makes none of 3 vocabulary tokens"), std::string::npos);
  // Reversed: "ab c" comes before "a b" makes "ab".
  j = tiny_tokenizer();
  j["model"]["merges"] = json::array({byte_char(' ') + " a", "ab c", "a b"});
  EXPECT_NE(error_for(j).find("for example 'abc'"), std::string::npos);
  // Added and special tokens need no merge; a merge whose part comes later is allowed as long as
  // the token also has one in order (converters from tiktoken ranks list every split).
  j = tiny_tokenizer();
  j["model"]["vocab"]["<pad>"] = 259;
  j["model"]["vocab"]["xy"] = 260;
  j["added_tokens"].push_back(json{{"id", 260}, {"content", "xy"}});
  j["model"]["merges"] = json::array({"a b", "a bc", "ab c", "b c", byte_char(' ') + " a"});
  j["model"]["vocab"]["bc"] = 261;
  HuggingFaceTokenizer converted(save(dir, j));
  EXPECT_EQ(converted.encode("abc"), (std::vector<int32_t>{257}));
  // A field of the wrong type deep inside is an Error naming the file.
  j = tiny_tokenizer();
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", 5}, {"sep", 6}};
  e = error_for(j);
  EXPECT_NE(e.find("a field has the wrong type or is missing"), std::string::npos) << e;
}

TEST(RegexSplitter, WhiteSpaceIsUnicodeWhiteSpaceAndGapsAreKept) {
  EXPECT_EQ(RegexSplitter::translate(R"(a\sb[^\s\p{L}]\S)"),
            std::string("a[") + "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}" +
                "]b[^\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\p{L}]" +
                "[^\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]");
  RegexSplitter spaces(R"(\s+)", "test");
  std::vector<std::pair<std::string, bool>> pieces;
  spaces.split("a \xE1\xA0\x8E\xE3\x80\x80" "b\xFF", [&](std::string_view p, bool m) { pieces.emplace_back(p, m); });
  // U+180E is not White_Space (it is in PCRE2's own \s); U+3000 is; 0xFF is a gap of its own.
  ASSERT_EQ(pieces.size(), 5u);
  EXPECT_EQ(pieces[1], (std::pair<std::string, bool>{" ", true}));
  EXPECT_EQ(pieces[2], (std::pair<std::string, bool>{"\xE1\xA0\x8E", false}));
  EXPECT_EQ(pieces[3], (std::pair<std::string, bool>{"\xE3\x80\x80", true}));
  EXPECT_EQ(pieces[4], (std::pair<std::string, bool>{"b\xFF", false}));
}

// A .tiktoken file with the 256 bytes and a few merges.
std::string tiny_ranks(bool json_form) {
  auto b64 = [](const std::string& s) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < s.size(); i += 3) {
      uint32_t v = uint32_t(uint8_t(s[i])) << 16;
      if (i + 1 < s.size()) v |= uint32_t(uint8_t(s[i + 1])) << 8;
      if (i + 2 < s.size()) v |= uint8_t(s[i + 2]);
      for (int k = 0; k < 4; ++k) out += k <= int(s.size() - i) ? a[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
  };
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  for (const char* t : {"ab", "abc", " a", "<s>"}) tokens.push_back(t);
  std::string out;
  json list = json::array();
  for (size_t r = 0; r < tokens.size(); ++r) {
    out += b64(tokens[r]) + " " + std::to_string(r) + "\n";
    list.push_back({{"rank", r}, {"token_bytes", b64(tokens[r])}, {"token_str", ""}});
  }
  return json_form ? list.dump() : out;
}

TEST(TikTokenizer, MegatronIdLayoutAndFlagChecks) {
  TempDir dir;
  write_file(dir / "tiny.tiktoken", tiny_ranks(false));
  write_file(dir / "tiny.json", tiny_ranks(true));
  TikTokenizer::Options o;
  o.ranks_file = (dir / "tiny.tiktoken").string();
  o.pattern = "v2";
  o.num_special_tokens = 10;
  o.vocab_size = 10 + 259;  // cuts the "<s>" rank, which would clash with the special token
  TikTokenizer tok(o);
  // "abc" is a token; in " ab" the rank-256 "ab" merges before the rank-258 " a".
  EXPECT_EQ(tok.encode("abc ab"), (std::vector<int32_t>{10 + 257, 10 + ' ', 10 + 256}));
  EXPECT_EQ(tok.encode("<s>").size(), 3u);  // special strings are ordinary text
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, 10 + 257, 2, 9}), "<s>abc</s><SPECIAL_9>");
  o.ranks_file = (dir / "tiny.json").string();
  EXPECT_EQ(TikTokenizer(o).encode("abc ab"), tok.encode("abc ab"));

  auto err = [&](auto change) {
    TikTokenizer::Options c = o;
    change(c);
    return error_of([&] { TikTokenizer t(c); });
  };
  EXPECT_NE(err([](auto& c) { c.vocab_size = 10 + 261; }).find("pass --vocab-size 270 or less"), std::string::npos);
  EXPECT_NE(err([](auto& c) { c.vocab_size = 10 + 260; }).find("also an ordinary token"), std::string::npos);
  EXPECT_NE(err([](auto& c) { c.pattern = "v3"; }).find("--tiktoken-pattern must be v1 or v2"), std::string::npos);
  EXPECT_NE(err([](auto& c) { c.special_tokens = {"<unk>", "<s>"}; }).find("'</s>' is missing"), std::string::npos);
  EXPECT_NE(err([](auto& c) { c.num_special_tokens = 2; }).find("--tiktoken-num-special-tokens 2"), std::string::npos);
  write_file(dir / "bad.tiktoken", "IQ== 0\nnot-base64! 1\n");
  EXPECT_NE(err([&](auto& c) { c.ranks_file = (dir / "bad.tiktoken").string(); }).find("line 2"), std::string::npos);
  write_file(dir / "gap.tiktoken", "IQ== 0\nIg== 2\n");
  EXPECT_NE(err([&](auto& c) { c.ranks_file = (dir / "gap.tiktoken").string(); }).find("rank 1 is missing"),
            std::string::npos);
}

}  // namespace
}  // namespace megatron::data
