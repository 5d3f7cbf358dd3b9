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
#include "tokenizer/stress_text.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::read_file;
using megatron::testing::run_command;
using megatron::testing::source_dir;

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
          if (j < ours.size())
            ctx_ours += std::to_string(ours[j]) + "'" + tok.token_text(ours[j]) + "' ";
          if (j < ref.size())
            ctx_ref += std::to_string(ref[j]) + "'" + tok.token_text(int32_t(ref[j])) + "' ";
        }
        FAIL() << file << " document " << d << ": first mismatch at token " << k << " (ours "
               << ours.size() << " tokens, tiktoken " << ref.size() << ")\n  ours:     " << ctx_ours
               << "\n  tiktoken: " << ctx_ref;
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
