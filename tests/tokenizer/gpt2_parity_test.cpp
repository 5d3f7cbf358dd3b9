// GPT2BPETokenizer against OpenAI's tiktoken `gpt2` encoding (tests/reference/tiktoken_gpt2.mjs,
// node) on the demo corpus (.cache/corpus/*.jsonl, ~15 MB of real English) plus a generated
// stress text (code, whitespace runs with tabs and \r\n, numbers, contractions, accented Latin,
// CJK, emoji with ZWJ sequences, combining marks, unusual Unicode spaces, punctuation runs).
// Ids must be identical document by document; decode(encode(x)) must give x back.
// Missing corpus or node packages fail the test with the command that provides them.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/gpt2_bpe.h"
#include "test_util.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::read_file;
using megatron::testing::run_command;
using megatron::testing::source_dir;

// Deterministic stress documents built from tricky fragments and separators.
std::vector<std::string> stress_documents() {
  const std::vector<std::string> fragments = {
      "Hello", "world", "IT'S", "it's", "don't", "we'LL", "they're", "I'd", "'s", "''", "'",
      "O'Neil's", "rock'n'roll", "123", "3.14159", "1,000,000", "0x7fff", "42nd", "¾", "Ⅻ",
      "٣٤٥", "१२३", "café", "naïve", "Ångström", "résumé", "Zoë", "façade", "Straße", "ΟΛΟΣ",
      "Привет", "мир", "東京", "日本語のテキスト", "中文字符", "한국어", "ไทย", "عربى", "עברית",
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "e\u0301", "a\u0308\u0301", "\u0915\u094D\u0937",
      "int main() { return 0; }", "for (i = 0; i < n; ++i) {", "x+=1;", "def f(x):", "->",
      "#include <vector>", "std::string", "a_b_c", "__init__", "http://example.com/a?b=c&d=e",
      "!!!", "...", "?!?", "---", "***", "(", ")", "[]", "{}", "<|endoftext|>", "<|im_start|>",
      "\u00a0", "\u2009", "\u3000", "\u200b", "\u2028", "\u0085", "\ufeff", "\t", "\x0b", "\x0c",
      "$", "€100", "£", "%", "@user", "#hashtag", "ﬁ", "Ⓐ", "\U0001D400", "\U00020000"};
  const std::vector<std::string> separators = {
      " ", " ", " ", "", "  ", "   ", "\n", "\n\n", "\r\n", "\r\n\r\n", "\t", "\t\t", " \t ",
      "\n    ", "\n\t", " \n", "\u00a0", "\u3000 ", "        "};
  std::mt19937 rng(1234);
  std::vector<std::string> docs;
  for (int d = 0; d < 400; ++d) {
    std::string doc;
    int n = 20 + int(rng() % 300);
    for (int k = 0; k < n; ++k) {
      doc += fragments[rng() % fragments.size()];
      doc += separators[rng() % separators.size()];
    }
    docs.push_back(doc);
  }
  docs.push_back(std::string(5000, ' ') + "x" + std::string(3000, '\n'));
  docs.push_back(std::string(20000, 'a'));
  // Long single pieces (merged by the heap-based path): random letters from small and large
  // alphabets, repeated patterns with many equal-rank pairs, punctuation and digit runs.
  auto random_run = [&](const std::string& alphabet, int len) {
    std::string s;
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  docs.push_back(random_run("abcdefghijklmnopqrstuvwxyz", 3000));
  docs.push_back(" " + random_run("ahelo", 4000) + " " + random_run("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", 2000));
  docs.push_back(random_run("!@#$%^&*()-=+[]{};:,.<>/?|~", 2500) + " " + random_run("0123456789", 3000));
  std::string pattern;
  for (int k = 0; k < 700; ++k) pattern += k % 3 ? "ab" : "aab";
  docs.push_back(pattern + "\n" + pattern.substr(1));
  docs.push_back("");
  return docs;
}

std::vector<std::string> read_jsonl_texts(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> texts;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return texts;
}

TEST(Gpt2Parity, IdsMatchTiktokenOnCorpusAndStressText) {
  const fs::path root = source_dir();
  const fs::path gpt2 = root / ".cache" / "gpt2";
  const std::vector<fs::path> corpus = {root / ".cache/corpus/brown.jsonl",
                                        root / ".cache/corpus/nlp.jsonl"};
  for (const auto& p : std::vector<fs::path>{gpt2 / "gpt2-vocab.json", gpt2 / "gpt2-merges.txt",
                                             corpus[0], corpus[1]})
    ASSERT_TRUE(fs::exists(p)) << p << " is missing: run scripts/get-corpus.sh";
  ASSERT_TRUE(fs::exists(root / "tests/reference/node_modules/tiktoken"))
      << "tiktoken is missing: run scripts/node-deps.sh";

  megatron::testing::TempDir tmp;
  const fs::path stress = tmp / "stress.jsonl";
  {
    std::ofstream f(stress);
    for (const auto& d : stress_documents()) f << nlohmann::json{{"text", d}}.dump() << "\n";
  }
  const fs::path ids_file = tmp / "tiktoken_ids.bin";
  auto r = run_command("node '" + (root / "tests/reference/tiktoken_gpt2.mjs").string() +
                       "' --out '" + ids_file.string() + "' '" + corpus[0].string() + "' '" +
                       corpus[1].string() + "' '" + stress.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string bin = read_file(ids_file);

  GPT2BPETokenizer tok((gpt2 / "gpt2-vocab.json").string(), (gpt2 / "gpt2-merges.txt").string());
  size_t offset = 0, docs = 0, tokens = 0;
  std::vector<int32_t> ours;
  for (const fs::path& file : {corpus[0], corpus[1], stress}) {
    const auto texts = read_jsonl_texts(file);
    for (size_t d = 0; d < texts.size(); ++d) {
      ASSERT_LE(offset + 4, bin.size()) << "reference ids end early at " << file << " doc " << d;
      uint32_t n;
      std::memcpy(&n, bin.data() + offset, 4);
      offset += 4;
      ASSERT_LE(offset + 4 * size_t(n), bin.size());
      std::vector<uint32_t> ref(n);
      std::memcpy(ref.data(), bin.data() + offset, 4 * size_t(n));
      offset += 4 * size_t(n);
      ours.clear();
      tok.encode(texts[d], ours);
      size_t k = 0;
      while (k < ours.size() && k < ref.size() && uint32_t(ours[k]) == ref[k]) ++k;
      if (k != ours.size() || k != ref.size()) {
        std::string ctx_ours, ctx_ref;
        for (size_t j = k >= 3 ? k - 3 : 0; j < k + 5; ++j) {
          if (j < ours.size()) ctx_ours += std::to_string(ours[j]) + "'" + tok.token_text(ours[j]) + "' ";
          if (j < ref.size()) ctx_ref += std::to_string(ref[j]) + "'" + tok.token_text(int32_t(ref[j])) + "' ";
        }
        FAIL() << file << " document " << d << ": first mismatch at token " << k << " (ours "
               << ours.size() << " tokens, tiktoken " << ref.size() << ")\n  ours:     "
               << ctx_ours << "\n  tiktoken: " << ctx_ref;
      }
      ASSERT_EQ(tok.decode(ours), texts[d]) << file << " document " << d << ": round trip";
      ++docs;
      tokens += n;
    }
  }
  EXPECT_EQ(offset, bin.size()) << "reference has more documents than the inputs";
  EXPECT_GT(docs, 5000u);
  EXPECT_GT(tokens, 3000000u);
}

}  // namespace
}  // namespace megatron::data
