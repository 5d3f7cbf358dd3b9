// BERT WordPiece (lower-case and cased) against a Python reference of the same algorithm built
// on Python's unicodedata and str.lower (tests/reference/bert_wordpiece_reference.py), on part
// of the demo corpus plus the stress text, with a vocab.txt the reference derives from that
// text. Ids must be identical document by document. A missing corpus fails the test with the
// command that builds it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/bert_wordpiece.h"
#include "test_util.h"
#include "tokenizer/stress_text.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::run_command;
using megatron::testing::source_dir;

// Copies the first `n` lines of `from` into `to`; returns their texts.
std::vector<std::string> head_jsonl(const fs::path& from, const fs::path& to, size_t n) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::vector<std::string> texts;
  std::string line;
  while (texts.size() < n && std::getline(in, line)) {
    if (line.empty()) continue;
    out << line << "\n";
    texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  }
  return texts;
}

TEST(BertParity, IdsMatchPythonReference) {
  const fs::path root = source_dir();
  const fs::path brown = root / ".cache/corpus/brown.jsonl", nlp = root / ".cache/corpus/nlp.jsonl";
  ASSERT_TRUE(fs::exists(brown) && fs::exists(nlp))
      << "demo corpus missing: run scripts/get-corpus.sh";
  megatron::testing::TempDir tmp;
  std::vector<std::string> texts = head_jsonl(brown, tmp / "brown.jsonl", 80);
  for (auto& t : head_jsonl(nlp, tmp / "nlp.jsonl", 800)) texts.push_back(t);
  {
    std::ofstream f(tmp / "stress.jsonl");
    for (const auto& d : stress_documents()) {
      f << nlohmann::json{{"text", d}}.dump() << "\n";
      texts.push_back(d);
    }
  }
  const std::string inputs = " '" + (tmp / "brown.jsonl").string() + "' '" +
                             (tmp / "nlp.jsonl").string() + "' '" +
                             (tmp / "stress.jsonl").string() + "'";
  const std::string script =
      "/usr/bin/python3 '" + (root / "tests/reference/bert_wordpiece_reference.py").string() + "' ";
  const fs::path vocab = tmp / "vocab.txt";
  auto r = run_command(script + "make-vocab '" + vocab.string() + "'" + inputs);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  for (bool lower : {true, false}) {
    const fs::path ref_file = tmp / (lower ? "lower.jsonl" : "cased.jsonl");
    r = run_command(script + "encode '" + vocab.string() + "' " + (lower ? "lower" : "cased") +
                    " '" + ref_file.string() + "'" + inputs);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    BertWordPieceTokenizer tok(vocab.string(), lower);
    std::ifstream ref(ref_file);
    std::string line;
    size_t tokens = 0, unknown = 0;
    for (size_t d = 0; d < texts.size(); ++d) {
      ASSERT_TRUE(std::getline(ref, line)) << "reference ends early at document " << d;
      const auto want = nlohmann::json::parse(line).get<std::vector<int32_t>>();
      const auto got = tok.encode(texts[d]);
      if (got != want) {
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
        std::string ctx_got, ctx_want;
        for (size_t j = k >= 3 ? k - 3 : 0; j < k + 5; ++j) {
          if (j < got.size()) ctx_got += tok.token(got[j]) + " ";
          if (j < want.size()) ctx_want += tok.token(want[j]) + " ";
        }
        FAIL() << tok.type() << " document " << d << ": first mismatch at token " << k
               << "\n  ours:      " << ctx_got << "\n  reference: " << ctx_want;
      }
      tokens += got.size();
      for (int32_t id : got) unknown += id == 1;
    }
    EXPECT_GT(tokens, 300000u) << tok.type();
    EXPECT_LT(unknown * 10, tokens) << tok.type() << ": the vocab should cover most words";
  }
}

}  // namespace
}  // namespace megatron::data
