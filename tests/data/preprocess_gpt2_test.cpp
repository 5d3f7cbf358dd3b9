// preprocess-data with the real GPT-2 tokenizer on the demo corpus (.cache/, built by
// scripts/get-corpus.sh): every document decodes back to its text; vocab file errors reach the
// user with the file name. Skips (saying why) when the corpus has not been built.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using megatron::testing::run_cli;
using megatron::testing::source_dir;
using megatron::testing::TempDir;
using megatron::testing::write_file;
namespace fs = std::filesystem;

const fs::path kVocab = source_dir() / ".cache/gpt2/gpt2-vocab.json";
const fs::path kMerges = source_dir() / ".cache/gpt2/gpt2-merges.txt";
const fs::path kCorpus = source_dir() / ".cache/corpus/demo.jsonl";

TEST(PreprocessGpt2, DemoCorpusRoundTrip) {
  if (!fs::exists(kVocab) || !fs::exists(kMerges) || !fs::exists(kCorpus))
    GTEST_SKIP() << "demo corpus or GPT-2 vocab missing; run scripts/get-corpus.sh";
  TokenizerOptions to;
  to.type = "GPT2BPETokenizer";
  to.vocab_file = kVocab.string();
  to.merge_file = kMerges.string();
  auto tok = build_tokenizer(to);
  TempDir dir;
  PreprocessOptions o;
  o.input = kCorpus.string();
  o.output_prefix = (dir / "demo").string();
  o.append_eod = true;
  o.workers = 2;
  o.progress = false;
  auto stats = preprocess_data(o, *tok);
  IndexedDataset ds(stats.output_prefixes[0]);
  EXPECT_EQ(ds.dtype(), IndexDType::U16);
  std::ifstream in(kCorpus);
  std::string line;
  int64_t doc = 0;
  while (std::getline(in, line)) {
    const std::string text = nlohmann::json::parse(line)["text"];
    ASSERT_LT(doc, ds.num_documents());
    std::vector<int32_t> ids;
    for (int64_t s = ds.document_indices()[doc]; s < ds.document_indices()[doc + 1]; ++s)
      ds.read(s, 0, ds.sequence_length(s), ids);
    if (text.empty()) {
      EXPECT_TRUE(ids.empty());
    } else {
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.back(), 50256) << "EOD ends document " << doc;
      ids.pop_back();
      ASSERT_EQ(tok->decode(ids), text) << "document " << doc;
    }
    ++doc;
  }
  EXPECT_EQ(doc, ds.num_documents());
  EXPECT_EQ(stats.documents, doc);
}

TEST(PreprocessGpt2, VocabFileErrorsNameTheFile) {
  TempDir dir;
  write_file(dir / "in.jsonl", "{\"text\": \"hello\"}\n");
  write_file(dir / "bad-vocab.json", "this is not json");
  write_file(dir / "merges.txt", "#version: 0.2\n");
  const std::string base = "preprocess-data --input '" + (dir / "in.jsonl").string() +
                           "' --output-prefix '" + (dir / "o").string() +
                           "' --workers 1 --tokenizer-type GPT2BPETokenizer";
  auto r = run_cli(base + " --vocab-file '" + (dir / "missing.json").string() + "' --merge-file '" +
                   (dir / "merges.txt").string() + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("missing.json"), std::string::npos) << r.output;
  r = run_cli(base + " --vocab-file '" + (dir / "bad-vocab.json").string() + "' --merge-file '" +
              (dir / "merges.txt").string() + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("bad-vocab.json"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "o_text_document.bin"));
}

}  // namespace
}  // namespace megatron::data
