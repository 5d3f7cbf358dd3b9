// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer against Debian's
// python3-sentencepiece with Megatron's wrappers (tests/reference/sentencepiece_reference.py):
// BPE and unigram models trained here on part of the Brown corpus, then ids, decoded text and
// special ids compared on held-out text (the nlp corpus, the stress text, special-token strings).
//
// Invalid UTF-8 (InvalidUtf8GoesToTheLibraryAsTheSameBytes): SentencePieceProcessor takes bytes as
// well as str, so the reference is given exactly our bytes (the wrappers' special-token search
// running on bytes). That is the fair comparison: libsentencepiece turns each invalid byte into
// U+FFFD, which no piece covers, so it becomes <unk> (decoded " \u2047 "), whereas a U+FFFD
// already in a Python str (bytes decoded with errors='replace') is removed by the nmt_nfkc
// normaliser: decoding first would give other ids than the library gives the bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "data/indexed_dataset.h"
#include "data/sentencepiece_tokenizer.h"
#include "test_util.h"
#include "tokenizer/parity_util.h"
#include "tokenizer/stress_text.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::source_dir;
using megatron::testing::TempDir;

const char* kPython = "/usr/bin/python3";

class SentencePieceParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    const fs::path root = source_dir();
    const fs::path brown = root / ".cache/corpus/brown.jsonl", nlp = root / ".cache/corpus/nlp.jsonl";
    ASSERT_TRUE(fs::exists(brown) && fs::exists(nlp)) << "run scripts/get-corpus.sh";
    // Training text: the lines of the first 60 Brown documents.
    const auto docs = parity::read_jsonl_texts(brown);
    std::string train;
    for (size_t d = 0; d < 60 && d < docs.size(); ++d) train += docs[d] + "\n";
    megatron::testing::write_file(*tmp_ / "train.txt", train);
    // Held out: 200 nlp documents, the stress text, special-token strings in text.
    auto held = parity::read_jsonl_texts(nlp);
    held.resize(std::min<size_t>(held.size(), 200));
    for (auto& d : stress_documents()) held.push_back(d);
    held.push_back("a<EOD>b <extra_id_1> </s><s>x<unk><CLS><SEP><MASK><PAD><extra_id_0>");
    held.push_back("<EOD><EOD>  <s> <<EOD>> <extra_id_2><extra_id_7>");
    parity::write_jsonl_texts(*tmp_ / "held.jsonl", held);
    parity::write_hex_texts(*tmp_ / "invalid.jsonl", invalid_utf8_documents());
    for (const char* type : {"bpe", "unigram"}) {
      const std::string err = parity::run_reference(
          std::string(kPython) + " '" + (root / "tests/reference/sentencepiece_reference.py").string() +
          "' train --input '" + (*tmp_ / "train.txt").string() + "' --model-prefix '" +
          (*tmp_ / type).string() + "' --model-type " + type + " --vocab-size 1000");
      ASSERT_EQ(err, "") << "(python3-sentencepiece is a Debian package: scripts/setup.sh)";
    }
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }

  void check(const std::string& model_type, SentencePieceTokenizer::Flavor flavor,
             const std::string& flavor_name, int extra_ids) {
    ASSERT_NE(tmp_, nullptr);
    const fs::path model = *tmp_ / (model_type + ".model");
    ASSERT_TRUE(fs::exists(model));
    const fs::path ids = *tmp_ / ("ids_" + model_type + flavor_name + ".bin");
    const fs::path decoded = *tmp_ / ("dec_" + model_type + flavor_name + ".jsonl");
    ASSERT_EQ(parity::run_reference(
                  std::string(kPython) + " '" +
                  (source_dir() / "tests/reference/sentencepiece_reference.py").string() +
                  "' encode --model '" + model.string() + "' --flavor " + flavor_name +
                  " --vocab-extra-ids " + std::to_string(extra_ids) + " --out '" + ids.string() +
                  "' --decoded '" + decoded.string() + "' '" + (*tmp_ / "held.jsonl").string() + "'"),
              "");
    SentencePieceTokenizer tok(model.string(), flavor, extra_ids);
    EXPECT_EQ(tok.type(), flavor_name);
    const auto texts = parity::read_jsonl_texts(*tmp_ / "held.jsonl");
    const auto ref = parity::read_id_file(ids);
    ASSERT_EQ(ref.size(), texts.size());
    std::ifstream dec(decoded);
    std::string line;
    std::getline(dec, line);
    const auto info = nlohmann::json::parse(line);
    EXPECT_EQ(tok.vocab_size(), info["vocab_size"].get<int64_t>());
    auto opt = [](std::optional<int32_t> v) { return v ? *v : -1; };
    EXPECT_EQ(opt(tok.eod()), info["eod"].get<int>());
    EXPECT_EQ(opt(tok.bos()), info["bos"].get<int>());
    EXPECT_EQ(opt(tok.eos()), info["eos"].get<int>());
    EXPECT_EQ(opt(tok.pad()), info["pad"].get<int>());
    size_t tokens = 0;
    for (size_t d = 0; d < texts.size(); ++d) {
      const auto ours = tok.encode(texts[d]);
      tokens += ours.size();
      ASSERT_EQ(parity::first_difference(ours, ref[d]), "") << "document " << d;
      ASSERT_TRUE(std::getline(dec, line));
      EXPECT_EQ(tok.decode(ours), nlohmann::json::parse(line)["text"].get<std::string>())
          << "decode of document " << d;
    }
    EXPECT_GT(tokens, 50000u);
  }

  static TempDir* tmp_;
};
TempDir* SentencePieceParity::tmp_ = nullptr;

using Flavor = SentencePieceTokenizer::Flavor;

TEST_F(SentencePieceParity, BpeSentencePieceTokenizerWithExtraIds) {
  check("bpe", Flavor::kSentencePiece, "SentencePieceTokenizer", 3);
}
TEST_F(SentencePieceParity, BpeGPTSentencePieceTokenizer) {
  check("bpe", Flavor::kGPTSentencePiece, "GPTSentencePieceTokenizer", 0);
}
TEST_F(SentencePieceParity, BpeLlama2Tokenizer) { check("bpe", Flavor::kLlama2, "Llama2Tokenizer", 0); }
TEST_F(SentencePieceParity, UnigramSentencePieceTokenizer) {
  check("unigram", Flavor::kSentencePiece, "SentencePieceTokenizer", 0);
}
TEST_F(SentencePieceParity, UnigramGPTSentencePieceTokenizer) {
  check("unigram", Flavor::kGPTSentencePiece, "GPTSentencePieceTokenizer", 0);
}
TEST_F(SentencePieceParity, UnigramLlama2Tokenizer) {
  check("unigram", Flavor::kLlama2, "Llama2Tokenizer", 0);
}

// preprocess-data end to end: every document is BOS + the reference ids + EOS (--append-eod).
TEST_F(SentencePieceParity, PreprocessDataWithLlama2TokenizerWritesTheReferenceIds) {
  const fs::path model = *tmp_ / "bpe.model", ids = *tmp_ / "cli_ref.bin";
  ASSERT_EQ(parity::run_reference(
                std::string(kPython) + " '" +
                (source_dir() / "tests/reference/sentencepiece_reference.py").string() +
                "' encode --model '" + model.string() + "' --flavor Llama2Tokenizer --out '" +
                ids.string() + "' --decoded '" + (*tmp_ / "cli_dec.jsonl").string() + "' '" +
                (*tmp_ / "held.jsonl").string() + "'"),
            "");
  auto r = megatron::testing::run_cli(
      "preprocess-data --input '" + (*tmp_ / "held.jsonl").string() + "' --output-prefix '" +
      (*tmp_ / "llama").string() + "' --tokenizer-type Llama2Tokenizer --tokenizer-model '" +
      model.string() + "' --append-eod --workers 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  SentencePieceTokenizer tok(model.string(), Flavor::kLlama2);
  const auto ref = parity::read_id_file(ids);
  IndexedDataset ds((*tmp_ / "llama_text_document").string());
  ASSERT_EQ(ds.num_documents(), int64_t(ref.size()));
  for (size_t d = 0; d < ref.size(); ++d) {
    std::vector<int32_t> got;
    for (int64_t s = ds.document_indices()[d]; s < ds.document_indices()[d + 1]; ++s)
      ds.read(s, 0, ds.sequence_length(s), got);
    auto expected = ref[d];
    expected.push_back(*tok.eod());
    ASSERT_EQ(parity::first_difference(got, expected), "") << "document " << d;
  }
}

TEST_F(SentencePieceParity, InvalidUtf8GoesToTheLibraryAsTheSameBytes) {
  const auto docs = invalid_utf8_documents();
  for (const auto& [model_type, flavor, name, extra] :
       {std::tuple{"bpe", Flavor::kSentencePiece, "SentencePieceTokenizer", 3},
        std::tuple{"bpe", Flavor::kLlama2, "Llama2Tokenizer", 0},
        std::tuple{"unigram", Flavor::kGPTSentencePiece, "GPTSentencePieceTokenizer", 0}}) {
    const fs::path model = *tmp_ / (std::string(model_type) + ".model");
    const fs::path ids = *tmp_ / "invalid_ids.bin", decoded = *tmp_ / "invalid_dec.jsonl";
    ASSERT_EQ(parity::run_reference(
                  std::string(kPython) + " '" +
                  (source_dir() / "tests/reference/sentencepiece_reference.py").string() +
                  "' encode --hex --model '" + model.string() + "' --flavor " + name +
                  " --vocab-extra-ids " + std::to_string(extra) + " --out '" + ids.string() +
                  "' --decoded '" + decoded.string() + "' '" + (*tmp_ / "invalid.jsonl").string() + "'"),
              "");
    SentencePieceTokenizer tok(model.string(), flavor, extra);
    const auto ref = parity::read_id_file(ids);
    ASSERT_EQ(ref.size(), docs.size());
    std::ifstream dec(decoded);
    std::string line;
    std::getline(dec, line);  // the special ids
    size_t unk = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const auto ours = tok.encode(docs[d]);
      ASSERT_EQ(parity::first_difference(ours, ref[d]), "") << name << " invalid document " << d;
      unk += size_t(std::count(ours.begin(), ours.end(), 0));
      ASSERT_TRUE(std::getline(dec, line));
      EXPECT_EQ(tok.decode(ours), nlohmann::json::parse(line)["text"].get<std::string>())
          << name << " decode of invalid document " << d;
    }
    EXPECT_GT(unk, docs.size()) << name << ": the invalid bytes are <unk> (id 0)";
  }
}

TEST(SentencePieceTokenizer, ErrorsNameTheFlagAndFile) {
  TempDir tmp;
  EXPECT_NE(megatron::testing::error_of([&] {
              SentencePieceTokenizer((tmp / "missing.model").string(), Flavor::kLlama2);
            }).find("--tokenizer-model"),
            std::string::npos);
  megatron::testing::write_file(tmp / "bad.model", "not a protobuf at all");
  const std::string e = megatron::testing::error_of(
      [&] { SentencePieceTokenizer((tmp / "bad.model").string(), Flavor::kGPTSentencePiece); });
  EXPECT_NE(e.find("bad.model"), std::string::npos) << e;
  EXPECT_NE(e.find("not a SentencePiece model"), std::string::npos) << e;
}

}  // namespace
}  // namespace megatron::data
