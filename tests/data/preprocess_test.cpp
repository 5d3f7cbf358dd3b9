// preprocess-data: round trips (text -> .bin/.idx -> decode == text), Megatron's document
// rules (lists = sentences, empty documents, EOD), ordering across many batches and workers,
// every kind of bad input (each a clear error naming file:line, or skipped and counted), and
// that failed or interrupted runs leave no output files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/sentence_splitter.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using megatron::testing::read_file;
using megatron::testing::run_cli;
using megatron::testing::run_command;
using megatron::testing::TempDir;
using megatron::testing::write_file;
namespace fs = std::filesystem;

// Byte-level test tokenizer: id = byte value + 1 (0 unused), EOD = 257. Decode is exact.
class ByteTokenizer final : public Tokenizer {
 public:
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    for (unsigned char c : text) out.push_back(int32_t(c) + 1);
  }
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids)
      if (id >= 1 && id <= 256) s.push_back(char(id - 1));
    return s;
  }
  int64_t vocab_size() const override { return 258; }
  std::optional<int32_t> eod() const override { return 257; }
  std::string type() const override { return "ByteTokenizer"; }
};

std::vector<std::string> decoded_documents(const std::string& prefix, const Tokenizer& tok) {
  IndexedDataset ds(prefix);
  std::vector<std::string> out;
  auto docs = ds.document_indices();
  for (size_t d = 0; d + 1 < docs.size(); ++d) {
    std::vector<int32_t> ids;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) ds.read(s, 0, ds.sequence_length(s), ids);
    out.push_back(tok.decode(ids));
  }
  return out;
}

size_t count_files(const fs::path& dir) {
  return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

PreprocessOptions options(const TempDir& dir, const std::string& input) {
  PreprocessOptions o;
  o.input = (dir / input).string();
  o.output_prefix = (dir / "out").string();
  o.workers = 2;
  o.progress = false;
  return o;
}

TEST(Preprocess, RoundTripManyDocumentsInOrderWithEscapes) {
  TempDir dir;
  std::string jsonl;
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) {
    std::string t = "doc " + std::to_string(i) + " caf\xC3\xA9 \xF0\x9F\x98\x80 \"q\"\n\ttab";
    texts.push_back(i % 500 == 7 ? std::string() : t);
    // Escapes: \" \n \t, \u00e9 and a surrogate pair for U+1F600.
    std::string esc = "doc " + std::to_string(i) + " caf\\u00e9 \\ud83d\\ude00 \\\"q\\\"\\n\\ttab";
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": \"" + (i % 500 == 7 ? "" : esc) + "\"}\n";
  }
  write_file(dir / "in.jsonl", jsonl);
  ByteTokenizer tok;
  for (int workers : {1, 3}) {
    auto o = options(dir, "in.jsonl");
    o.workers = workers;
    auto stats = preprocess_data(o, tok);
    EXPECT_EQ(stats.documents, 3000);
    EXPECT_EQ(stats.empty, 6);
    EXPECT_EQ(stats.skipped, 0);
    ASSERT_EQ(stats.output_prefixes, std::vector<std::string>{(dir / "out_text_document").string()});
    EXPECT_EQ(decoded_documents(stats.output_prefixes[0], tok), texts);
    IndexedDataset ds(stats.output_prefixes[0]);
    EXPECT_EQ(ds.dtype(), IndexDType::U16);
    EXPECT_EQ(ds.num_sequences(), 3000 - 6);  // empty documents have no sequence
  }
}

TEST(Preprocess, MegatronDocumentRulesListsEodAndSeveralKeys) {
  TempDir dir;
  write_file(dir / "in.jsonl",
             "{\"text\": [\"ab\", \"\", \"c\"], \"title\": \"T\"}\n"
             "{\"text\": \"\", \"title\": [\"x\", \"yz\"]}\n"
             "{\"text\": [], \"title\": \"\"}\n");
  ByteTokenizer tok;
  auto o = options(dir, "in.jsonl");
  o.json_keys = {"text", "title"};
  o.append_eod = true;
  auto stats = preprocess_data(o, tok);
  ASSERT_EQ(stats.output_prefixes.size(), 2u);
  IndexedDataset text(stats.output_prefixes[0]), title(stats.output_prefixes[1]);
  // text: doc0 = sentences "ab", "c"+EOD; doc1, doc2 empty (no EOD on empty documents).
  EXPECT_EQ(std::vector<int64_t>(text.document_indices().begin(), text.document_indices().end()),
            (std::vector<int64_t>{0, 2, 2, 2}));
  EXPECT_EQ(text.get(0), (std::vector<int32_t>{'a' + 1, 'b' + 1}));
  EXPECT_EQ(text.get(1), (std::vector<int32_t>{'c' + 1, 257}));
  EXPECT_EQ(title.get(0), (std::vector<int32_t>{'T' + 1, 257}));
  EXPECT_EQ(title.get(1), (std::vector<int32_t>{'x' + 1}));
  EXPECT_EQ(title.get(2), (std::vector<int32_t>{'y' + 1, 'z' + 1, 257}));
  EXPECT_EQ(title.num_documents(), 3);
  EXPECT_EQ(stats.empty, 1);
}

TEST(Preprocess, TextInputsSentenceSplittingAndKeepNewlines) {
  TempDir dir;
  write_file(dir / "lines.txt", "First doc. Second sentence.\r\n\nThird doc\n");
  write_file(dir / "paras.txt", "para one\nline two\n\n\npara two\n");
  ByteTokenizer tok;
  auto o = options(dir, "lines.txt");
  auto stats = preprocess_data(o, tok);
  EXPECT_EQ(decoded_documents(stats.output_prefixes[0], tok),
            (std::vector<std::string>{"First doc. Second sentence.", "", "Third doc"}));
  o.split_sentences = true;
  stats = preprocess_data(o, tok);
  ASSERT_EQ(stats.output_prefixes[0], (dir / "out_text_sentence").string());
  IndexedDataset ds(stats.output_prefixes[0]);
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(tok.decode(ds.get(1)), "Second sentence.");
  o = options(dir, "paras.txt");
  o.input_format = InputFormat::TextParagraphs;
  stats = preprocess_data(o, tok);
  EXPECT_EQ(decoded_documents(stats.output_prefixes[0], tok),
            (std::vector<std::string>{"para one\nline two", "para two"}));
}

TEST(SentenceSplitter, Rules) {
  auto s = split_sentences("Mr. Smith went to Washington. He met J. R. Doe, e.g. at 5 p.m. "
                           "today! Did he? \"Yes.\" (Maybe.) 3 cats left.",
                           false);
  EXPECT_EQ(s, (std::vector<std::string_view>{"Mr. Smith went to Washington.",
                                              "He met J. R. Doe, e.g. at 5 p.m. today!",
                                              "Did he?", "\"Yes.\"", "(Maybe.)", "3 cats left."}));
  EXPECT_EQ(split_sentences("  no end  ", false), (std::vector<std::string_view>{"no end"}));
  EXPECT_EQ(split_sentences("A bc.\nCd e.\n", true),
            (std::vector<std::string_view>{"A bc.\n", "Cd e.\n"}));
  EXPECT_EQ(split_sentences("version 1.5 is out. lower case after.", false).size(), 1u);
  EXPECT_TRUE(split_sentences(" \n ", false).empty());
}

void expect_error(const PreprocessOptions& o, const Tokenizer& tok,
                  const std::vector<std::string>& needles) {
  try {
    preprocess_data(o, tok);
    ADD_FAILURE() << "expected an error with " << needles[0];
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
  // A failed run leaves nothing but its inputs.
  for (const auto& entry : fs::directory_iterator(fs::path(o.output_prefix).parent_path()))
    EXPECT_EQ(entry.path().string().find("out_"), std::string::npos) << entry.path();
}

TEST(Preprocess, BadInputsFailWithFileLineOrAreSkipped) {
  TempDir dir;
  ByteTokenizer tok;
  const std::string good = "{\"text\": \"fine\"}\n";
  struct Case {
    std::string line, needle;
  };
  std::vector<Case> cases = {
      {"{\"text\": \"unterminated}", "malformed JSON"},
      {"", "malformed JSON"},
      {"[1, 2]", "expected a JSON object, found a list"},
      {"{\"other\": \"x\"}", "missing key 'text'"},
      {"{\"text\": 42}", "has a number value"},
      {"{\"text\": [\"a\", null]}", "list holding a null"},
      {"{\"text\": \"bad \xC3\x28 byte\"}", "invalid UTF-8 at byte offset " + std::to_string(2 * good.size() + 14)},
      {"{\"text\": \"\xED\xA0\x80\"}", "invalid UTF-8"},           // encoded surrogate
      {"{\"text\": \"\\ud800 lone\"}", "malformed JSON"},          // lone surrogate escape
  };
  for (const auto& c : cases) {
    write_file(dir / "in.jsonl", good + good + c.line + "\n" + good);
    auto o = options(dir, "in.jsonl");
    expect_error(o, tok, {(dir / "in.jsonl").string() + ":3: ", c.needle});
    o.skip_errors = true;
    auto stats = preprocess_data(o, tok);
    EXPECT_EQ(stats.skipped, 1) << c.line;
    EXPECT_EQ(stats.documents, 3) << c.line;
    fs::remove(dir / "out_text_document.bin");
    fs::remove(dir / "out_text_document.idx");
  }
  // Bad on the very last line of a larger input: nothing is written.
  std::string big;
  for (int i = 0; i < 5000; ++i) big += good;
  write_file(dir / "in.jsonl", big + "{\"text\": 1}");
  expect_error(options(dir, "in.jsonl"), tok, {":5001: "});
  EXPECT_EQ(count_files(dir.path()), 1u);
  // Missing input, folder as input, unwritable output folder, tokenizer errors.
  expect_error(options(dir, "missing.jsonl"), tok, {"cannot open --input", "missing.jsonl"});
  auto o = options(dir, "in.jsonl");
  o.input = dir.path().string();
  expect_error(o, tok, {"is a folder"});
  write_file(dir / "in.jsonl", good);
  o = options(dir, "in.jsonl");
  o.output_prefix = (dir / "no-such-folder" / "out").string();
  EXPECT_THROW(preprocess_data(o, tok), Error);
  NullTokenizer null_tok(100);
  write_file(dir / "in.jsonl", "{\"text\": \"1 2 x\"}\n");
  expect_error(options(dir, "in.jsonl"), null_tok, {":1: ", "not an integer"});
}

TEST(Preprocess, EmptyInputGivesEmptyDataset) {
  TempDir dir;
  write_file(dir / "in.jsonl", "");
  ByteTokenizer tok;
  auto stats = preprocess_data(options(dir, "in.jsonl"), tok);
  EXPECT_EQ(stats.documents, 0);
  IndexedDataset ds(stats.output_prefixes[0]);
  EXPECT_EQ(ds.num_documents(), 0);
  EXPECT_EQ(ds.num_sequences(), 0);
}

TEST(Preprocess, HundredMegabyteLine) {
  TempDir dir;
  {
    std::ofstream f(dir / "in.jsonl", std::ios::binary);
    f << "{\"text\": \"1 2";
    std::string spaces(1 << 20, ' ');
    for (int i = 0; i < 100; ++i) f << spaces;
    f << "3\"}\n{\"text\": \"4\"}\n";
  }
  NullTokenizer tok(10);
  auto o = options(dir, "in.jsonl");
  o.append_eod = true;
  auto stats = preprocess_data(o, tok);
  IndexedDataset ds(stats.output_prefixes[0]);
  EXPECT_EQ(ds.get(0), (std::vector<int32_t>{1, 2, 3, 9}));
  EXPECT_EQ(ds.get(1), (std::vector<int32_t>{4, 9}));
}

TEST(Preprocess, StopRequestLeavesNoFiles) {
  TempDir dir;
  write_file(dir / "in.jsonl", "{\"text\": \"a\"}\n");
  ByteTokenizer tok;
  std::atomic<bool> stop{true};
  auto o = options(dir, "in.jsonl");
  o.stop_requested = &stop;
  expect_error(o, tok, {"interrupted"});
  EXPECT_EQ(count_files(dir.path()), 1u);
}

}  // namespace
}  // namespace megatron::data
