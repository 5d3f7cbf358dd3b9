// Parquet input: files written by an independent writer (tests/reference/write_parquet.mjs:
// apache-arrow + parquet-wasm, the Rust arrow-rs writer) with each compression (none, snappy,
// gzip, zstd), encoding (plain, dictionary, delta-length, delta) and page version, in several row
// groups and pages, read back equal to their JSONL twin; preprocess-data on a glob of Parquet files
// writes the same .bin/.idx bytes as on the JSONL; nulls, missing columns, unsupported
// compression, and truncated or corrupted files give errors naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "data/parquet_reader.h"
#include "test_util.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::error_of;
using megatron::testing::read_file;
using megatron::testing::run_cli;
using megatron::testing::run_command;
using megatron::testing::source_dir;
using megatron::testing::TempDir;
using megatron::testing::write_file;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

struct Row {
  std::string text, title;
};

// 300 nlp-corpus documents plus odd values, each with a short title (repeated titles give the
// dictionary encoder something to share).
std::vector<Row> twin_rows() {
  std::vector<Row> rows;
  std::ifstream f(source_dir() / ".cache/corpus/nlp.jsonl");
  std::string line;
  while (rows.size() < 300 && std::getline(f, line)) {
    const std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
    rows.push_back({text, "doc " + std::to_string(rows.size() % 17)});
  }
  for (std::string odd : {std::string(""), std::string("😀 emoji \u3000 and \t tabs"),
                          std::string(70000, 'x'), std::string("\x01\x7f control"),
                          std::string("same prefix, different end A"),
                          std::string("same prefix, different end B")})
    rows.push_back({odd, odd.substr(0, 10)});
  return rows;
}

void write_twin(const fs::path& jsonl, const std::vector<Row>& rows) {
  std::ofstream f(jsonl);
  for (const Row& r : rows) f << nlohmann::json{{"text", r.text}, {"title", r.title}}.dump() << "\n";
}

std::string write_parquet(const fs::path& in, const fs::path& out, const std::string& options) {
  auto r = run_command("node " + q(source_dir() / "tests/reference/write_parquet.mjs") + " " + q(in) +
                       " " + q(out) + " " + options);
  return r.exit_code == 0 ? "" : r.output;
}

class ParquetTwin : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    ASSERT_TRUE(fs::exists(source_dir() / ".cache/corpus/nlp.jsonl")) << "run scripts/get-corpus.sh";
    ASSERT_TRUE(fs::exists(source_dir() / "tests/reference/node_modules/parquet-wasm"))
        << "run scripts/node-deps.sh";
    rows_ = new std::vector<Row>(twin_rows());
    write_twin(*tmp_ / "twin.jsonl", *rows_);
  }
  static void TearDownTestSuite() {
    delete tmp_;
    delete rows_;
  }
  static TempDir* tmp_;
  static std::vector<Row>* rows_;
};
TempDir* ParquetTwin::tmp_ = nullptr;
std::vector<Row>* ParquetTwin::rows_ = nullptr;

TEST_F(ParquetTwin, EveryCompressionEncodingAndPageVersionReadsBackTheJsonlRecords) {
  struct Case {
    const char* compression;
    const char* encoding;
    const char* page_version;
  };
  const Case cases[] = {
      {"none", "plain", "1"},         {"snappy", "plain", "1"},       {"gzip", "plain", "1"},
      {"zstd", "plain", "1"},         {"none", "dictionary", "1"},    {"snappy", "dictionary", "2"},
      {"zstd", "dictionary", "1"},    {"gzip", "delta-length", "2"},  {"none", "delta", "1"},
      {"zstd", "delta", "2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.compression) + " " + c.encoding + " v" + c.page_version);
    const fs::path file = *tmp_ / (std::string(c.compression) + "_" + c.encoding + c.page_version + ".parquet");
    ASSERT_EQ(write_parquet(*tmp_ / "twin.jsonl", file,
                            std::string("--compression ") + c.compression + " --encoding " + c.encoding +
                                " --page-version " + c.page_version +
                                " --row-group-rows 64 --page-bytes 8192"),
              "");
    ParquetFile pf(file.string());
    EXPECT_EQ(pf.num_rows(), int64_t(rows_->size()));
    EXPECT_GE(pf.num_row_groups(), 5u);
    const size_t text = pf.string_column("text", "--json-keys");
    const size_t title = pf.string_column("title", "--json-keys");
    size_t row = 0;
    for (size_t g = 0; g < pf.num_row_groups(); ++g) {
      const StringColumn t = pf.read(g, text), h = pf.read(g, title);
      ASSERT_EQ(t.size(), size_t(pf.row_group_rows(g)));
      ASSERT_EQ(h.size(), t.size());
      for (size_t r = 0; r < t.size(); ++r, ++row) {
        ASSERT_FALSE(t.is_null(r) || h.is_null(r));
        ASSERT_EQ(t.value(r), (*rows_)[row].text) << "row " << row;
        ASSERT_EQ(h.value(r), (*rows_)[row].title) << "row " << row;
      }
    }
    EXPECT_EQ(row, rows_->size());
  }
}

TEST_F(ParquetTwin, PreprocessDataOnAParquetGlobEqualsTheJsonl) {
  const fs::path vocab = source_dir() / ".cache/gpt2/gpt2-vocab.json";
  const fs::path merges = source_dir() / ".cache/gpt2/gpt2-merges.txt";
  ASSERT_TRUE(fs::exists(vocab)) << "run scripts/get-corpus.sh";
  // The twin split into two files (rows 0-199, 200-), written with different settings.
  std::vector<Row> first(rows_->begin(), rows_->begin() + 200), second(rows_->begin() + 200, rows_->end());
  fs::create_directories(*tmp_ / "shards");
  write_twin(*tmp_ / "a.jsonl", first);
  write_twin(*tmp_ / "b.jsonl", second);
  ASSERT_EQ(write_parquet(*tmp_ / "a.jsonl", *tmp_ / "shards/part-0.parquet",
                          "--compression snappy --encoding dictionary --row-group-rows 50"), "");
  ASSERT_EQ(write_parquet(*tmp_ / "b.jsonl", *tmp_ / "shards/part-1.parquet",
                          "--compression zstd --encoding plain --page-version 2"), "");
  const std::string tok = " --tokenizer-type GPT2BPETokenizer --vocab-file " + q(vocab) +
                          " --merge-file " + q(merges) + " --append-eod --workers 2 --json-keys text title";
  auto r = run_cli("preprocess-data --input " + q(*tmp_ / "twin.jsonl") + " --output-prefix " +
                   q(*tmp_ / "from_jsonl") + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli("preprocess-data --input " + q(*tmp_ / "shards/*.parquet") + " --output-prefix " +
              q(*tmp_ / "from_parquet") + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* key : {"text", "title"})
    for (const char* ext : {".bin", ".idx"}) {
      const std::string name = std::string("_") + key + "_document" + ext;
      EXPECT_EQ(read_file(*tmp_ / ("from_parquet" + name)), read_file(*tmp_ / ("from_jsonl" + name)))
          << name;
    }
}

TEST_F(ParquetTwin, NullsAndMissingColumnsAreReportedWithTheRow) {
  write_file(*tmp_ / "nulls.jsonl", "{\"text\": \"one\"}\n{\"text\": null}\n{\"text\": \"three\"}\n");
  const fs::path file = *tmp_ / "nulls.parquet";
  ASSERT_EQ(write_parquet(*tmp_ / "nulls.jsonl", file, "--compression gzip"), "");
  ParquetFile pf(file.string());
  const StringColumn c = pf.read(0, pf.string_column("text", "--json-keys"));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_FALSE(c.is_null(0));
  EXPECT_TRUE(c.is_null(1));
  EXPECT_EQ(c.value(2), "three");
  const std::string e = error_of([&] { pf.string_column("body", "--json-keys"); });
  EXPECT_NE(e.find("no column 'body'"), std::string::npos) << e;
  EXPECT_NE(e.find("the file has: text"), std::string::npos) << e;

  const std::string args = " --output-prefix " + q(*tmp_ / "nulls") +
                           " --tokenizer-type NullTokenizer --vocab-size 100 --workers 1";
  write_file(*tmp_ / "ints.jsonl", "{\"text\": \"1 2\"}\n{\"text\": null}\n{\"text\": \"3\"}\n");
  ASSERT_EQ(write_parquet(*tmp_ / "ints.jsonl", *tmp_ / "ints.parquet", ""), "");
  auto r = run_cli("preprocess-data --input " + q(*tmp_ / "ints.parquet") + args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("ints.parquet: row 2: column 'text' is null"), std::string::npos) << r.output;
  r = run_cli("preprocess-data --input " + q(*tmp_ / "ints.parquet") + args + " --on-error skip");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("documents: 2 (empty: 0, skipped: 1)"), std::string::npos) << r.output;
}

TEST_F(ParquetTwin, TruncatedAndCorruptedFilesGiveErrorsNamingTheFile) {
  const fs::path good = *tmp_ / "good.parquet";
  ASSERT_EQ(write_parquet(*tmp_ / "twin.jsonl", good,
                          "--compression snappy --encoding dictionary --row-group-rows 100"), "");
  const std::string bytes = read_file(good);
  auto read_all = [](const fs::path& p) {
    ParquetFile pf(p.string());
    const size_t k = pf.string_column("text", "--json-keys");
    for (size_t g = 0; g < pf.num_row_groups(); ++g) pf.read(g, k);
  };
  // Truncation anywhere: the end magic or footer is gone.
  for (size_t keep : {size_t(0), size_t(3), size_t(11), size_t(100), bytes.size() / 2, bytes.size() - 1}) {
    const fs::path cut = *tmp_ / "cut.parquet";
    write_file(cut, bytes.substr(0, keep));
    const std::string e = error_of([&] { read_all(cut); });
    EXPECT_NE(e.find("cut.parquet"), std::string::npos) << keep << ": " << e;
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("not a Parquet file") != std::string::npos)
        << keep << ": " << e;
  }
  // Damaged bytes anywhere (footer, page headers, page data) never crash or hang: each read
  // either succeeds or throws megatron::Error naming the file. (Damage to statistics, metadata
  // strings or uncompressed text cannot be seen: Parquet checksums are optional and this writer
  // leaves them out.)
  std::mt19937 rng(7);
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string damaged = bytes;
    const size_t at = trial < 100 ? bytes.size() - 8 - 1 - rng() % std::min<size_t>(400, bytes.size() - 9)
                                  : 4 + rng() % (bytes.size() - 12);
    damaged[at] = char(uint8_t(damaged[at]) ^ (1u << (rng() % 8)));
    const fs::path bad = *tmp_ / "bad.parquet";
    write_file(bad, damaged);
    try {
      read_all(bad);
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("bad.parquet"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(errors, 20);
  // Damage that must be seen: a footer length beyond the file, a garbled first page header.
  std::string huge = bytes;
  for (int k = 5; k <= 8; ++k) huge[bytes.size() - size_t(k)] = char(0x7F);
  write_file(*tmp_ / "huge.parquet", huge);
  std::string e = error_of([&] { read_all(*tmp_ / "huge.parquet"); });
  EXPECT_NE(e.find("exceeds the file size"), std::string::npos) << e;
  std::string garbled = bytes;
  for (size_t k = 4; k < 20; ++k) garbled[k] = char(0xFF);
  write_file(*tmp_ / "garbled.parquet", garbled);
  e = error_of([&] { read_all(*tmp_ / "garbled.parquet"); });
  EXPECT_NE(e.find("garbled.parquet: row group 0, column 'text', page 0"), std::string::npos) << e;
}

TEST_F(ParquetTwin, UnsupportedCompressionIsNamed) {
  const fs::path file = *tmp_ / "brotli.parquet";
  ASSERT_EQ(write_parquet(*tmp_ / "twin.jsonl", file, "--compression brotli"), "");
  ParquetFile pf(file.string());
  const std::string e = error_of([&] { pf.read(0, pf.string_column("text", "--json-keys")); });
  EXPECT_NE(e.find("compression BROTLI is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("brotli.parquet"), std::string::npos) << e;
}

}  // namespace
}  // namespace megatron::data
