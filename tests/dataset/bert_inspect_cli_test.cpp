// `megatron inspect-data --samples N --dataset-type bert|t5 --format json --split-name S ...`: the
// samples pretrain-bert and pretrain-t5 train on, from data written by `preprocess-data
// --split-sentences` with BertWordPieceLowerCase, against Megatron's algorithm in Python
// (tests/reference/megatron_bert_dataset.py, megatron_t5_dataset.py), split sizes computed from
// the iteration flags as Megatron's training loop does; and the errors of the sample-printing mode.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bert_test_data.h"
#include "data/bert_wordpiece.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

using megatron::testing::run_cli;
using megatron::testing::TempDir;
using nlohmann::json;

namespace {

std::string q(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

// Documents of 1..6 sentences: capitalised words, words that WordPiece splits into "##" pieces.
// Returns the number of sentences.
int64_t write_corpus(const std::filesystem::path& path, int documents) {
  std::mt19937 gen(11);
  auto pick = [&](int n) { return int(gen() % uint32_t(n)); };
  std::string out;
  int64_t total = 0;
  for (int d = 0; d < documents; ++d) {
    std::string text;
    const int sentences = 1 + pick(6);
    total += sentences;
    for (int s = 0; s < sentences; ++s) {
      const int words = 1 + pick(14);
      for (int w = 0; w < words; ++w) {
        std::string word = "w" + std::to_string(pick(megatron::testing::kBertWords));
        if (w == 0) word[0] = 'W';
        for (int p = pick(4); p-- > 2;) word += "p" + std::to_string(pick(megatron::testing::kBertPieces));
        text += word + (w + 1 < words ? " " : "");
      }
      text += s % 3 == 2 ? "! " : ". ";
    }
    out += json({{"text", text}}).dump() + "\n";
  }
  megatron::testing::write_file(path, out);
  return total;
}

std::vector<json> json_lines(const std::string& output) {
  std::vector<json> out;
  std::istringstream is(output);
  for (std::string line; std::getline(is, line);)
    if (!line.empty() && line[0] == '{') out.push_back(json::parse(line));
  return out;
}

}  // namespace

TEST(BertInspectCli, PrintsMegatronsSamplesOfSentenceSplitData) {
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "vocab.txt");
  const int64_t sentences = write_corpus(dir / "corpus.jsonl", 300);
  const std::string tok = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + q(dir / "vocab.txt");
  auto r = run_cli("preprocess-data --input " + q(dir / "corpus.jsonl") + " --output-prefix " + q(dir / "wiki") +
                   tok + " --split-sentences --workers 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto prefix = (dir / "wiki_text_sentence").string();
  // One sequence per sentence, with "##" pieces.
  megatron::data::IndexedDataset ds(prefix);
  EXPECT_EQ(ds.num_documents(), 300);
  EXPECT_EQ(ds.num_sequences(), sentences);
  megatron::data::BertWordPieceTokenizer wp((dir / "vocab.txt").string(), true);
  int64_t pieces = 0;
  for (int32_t id : ds.get(1)) pieces += wp.token(id).starts_with("##");
  for (int32_t id : ds.get(2)) pieces += wp.token(id).starts_with("##");
  EXPECT_GT(pieces, 0);

  // --train-iters 10 --global-batch-size 4 --eval-interval 5 --eval-iters 2:
  // train 40, valid (10 / 5 + 1) * 2 * 4 = 24, test 2 * 4 = 8 samples.
  const std::string flags = " --data-path " + q(prefix) + tok +
                            " --split 80,15,5 --seq-length 40 --seed 321 --mask-prob 0.2 --short-seq-prob 0.15"
                            " --micro-batch-size 2 --global-batch-size 4 --train-iters 10 --eval-interval 5"
                            " --eval-iters 2 --data-cache-path " + q(dir / "cache");
  std::vector<json> reqs;
  for (std::string split : {"train", "valid", "test"})
    for (bool head : {true, false})
      reqs.push_back({{"op", "samples"},        {"vocab_file", (dir / "vocab.txt").string()},
                      {"seq_length", 40},       {"seed", 321},
                      {"mask_prob", 0.2},       {"short_seq_prob", 0.15},
                      {"binary_head", head},    {"num_samples", {40, 24, 8}},
                      {"data_path", {prefix}},  {"split", "80,15,5"},
                      {"split_name", split},    {"count", 8}});
  auto want = megatron::testing::ask_bert_reference(reqs);
  ASSERT_EQ(want.size(), reqs.size());
  for (const auto& req : reqs) {
    const std::string split = req["split_name"];
    const bool head = req["binary_head"];
    r = run_cli("inspect-data --samples 8 --dataset-type bert --format json --split-name " + split + flags +
                (head ? "" : " --bert-no-binary-head"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto got = json_lines(r.output);
    std::vector<std::string> lines;
    std::istringstream is(r.output);
    for (std::string line; std::getline(is, line);)
      if (!line.empty() && line[0] == '{') lines.push_back(line);
    const auto& expect = want[size_t(&req - reqs.data())]["samples"];
    ASSERT_EQ(got.size(), 8u) << r.output;
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k], expect[k]) << split << (head ? " binary head" : "") << " sample " << k;
      std::vector<std::string> keys;  // in the order printed
      const auto ordered = nlohmann::ordered_json::parse(lines[k]);
      for (auto it = ordered.begin(); it != ordered.end(); ++it) keys.push_back(it.key());
      EXPECT_EQ(keys, (std::vector<std::string>{"text", "types", "labels", "is_random", "padding_mask",
                                                "loss_mask", "truncated"}));
    }
  }
}

TEST(BertInspectCli, ClearErrors) {
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "vocab.txt");
  const auto prefix = (dir / "d").string();
  megatron::testing::write_sentence_dataset(prefix, {.documents = 40});
  const std::string base =
      " --data-path " + q(prefix) + " --split 80,10,10 --seq-length 32 --train-iters 2 --eval-iters 1";
  const std::string tok = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + q(dir / "vocab.txt");
  auto r = run_cli("inspect-data --samples 2 --dataset-type bert" + base + tok);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--format json"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --format json" + base + tok);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dataset-type bert"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --format ids --split-name valid" + base);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--split-name"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --dataset-type bert --format json" + base +
              " --tokenizer-type NullTokenizer --vocab-size 1000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("WordPiece"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --dataset-type bert --format json" + base);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--tokenizer-type"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 100000 --dataset-type bert --format json" + base + tok);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("samples but the train split has"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --dataset-type bert --format json --split-name test --split 100,0,0"
              " --data-path " + q(prefix) + " --seq-length 32 --train-iters 2 --eval-iters 1" + tok);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("test split is empty"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --dataset-type bert --format json --mask-prob 1.5" + base + tok);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--mask-prob"), std::string::npos) << r.output;
}

TEST(T5InspectCli, PrintsMegatronsSamplesOfSentenceSplitData) {
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "vocab.txt");
  write_corpus(dir / "corpus.jsonl", 300);
  const std::string tok = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + q(dir / "vocab.txt");
  auto r = run_cli("preprocess-data --input " + q(dir / "corpus.jsonl") + " --output-prefix " + q(dir / "wiki") +
                   tok + " --split-sentences --workers 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto prefix = (dir / "wiki_text_sentence").string();
  // Train 40, valid 24, test 8 samples (see above).
  const std::string flags = " --data-path " + q(prefix) + tok + " --vocab-extra-ids 100" +
                            " --split 80,15,5 --decoder-seq-length 20 --seed 321 --mask-prob 0.2"
                            " --short-seq-prob 0.15 --micro-batch-size 2 --global-batch-size 4 --train-iters 10"
                            " --eval-interval 5 --eval-iters 2 --data-cache-path " + q(dir / "cache");
  std::vector<json> reqs;
  for (std::string split : {"train", "valid", "test"})
    reqs.push_back({{"op", "samples"},         {"vocab_file", (dir / "vocab.txt").string()},
                    {"vocab_extra_ids", 100},  {"encoder_seq_length", 48},
                    {"decoder_seq_length", 20}, {"seed", 321},
                    {"mask_prob", 0.2},        {"short_seq_prob", 0.15},
                    {"num_samples", {40, 24, 8}}, {"data_path", {prefix}},
                    {"split", "80,15,5"},      {"split_name", split},
                    {"count", 8}});
  auto want = megatron::testing::ask_bert_reference(reqs, "megatron_t5_dataset.py");
  ASSERT_EQ(want.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string split = reqs[i]["split_name"];
    // --seq-length is Megatron's alias of --encoder-seq-length.
    const std::string length = i == 1 ? " --seq-length 48" : " --encoder-seq-length 48";
    r = run_cli("inspect-data --samples 8 --dataset-type t5 --format json --split-name " + split + length + flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto got = json_lines(r.output);
    ASSERT_EQ(got.size(), 8u) << r.output;
    for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], want[i]["samples"][k]) << split << " sample " << k;
    const size_t first = r.output.find('{');
    const auto ordered = nlohmann::ordered_json::parse(r.output.substr(first, r.output.find('\n', first) - first));
    std::vector<std::string> keys;
    for (auto it = ordered.begin(); it != ordered.end(); ++it) keys.push_back(it.key());
    EXPECT_EQ(keys, (std::vector<std::string>{"text_enc", "text_dec", "labels", "loss_mask", "truncated", "enc_mask",
                                              "dec_mask"}));
  }
}

TEST(T5InspectCli, ClearErrors) {
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "vocab.txt");
  const auto prefix = (dir / "d").string();
  megatron::testing::write_sentence_dataset(prefix, {.documents = 40});
  const std::string base = " --samples 2 --dataset-type t5 --format json --data-path " + q(prefix) +
                           " --split 80,10,10 --train-iters 2 --eval-iters 1 --tokenizer-type BertWordPieceLowerCase"
                           " --vocab-file " + q(dir / "vocab.txt");
  struct Case {
    std::string flags, needle;
  };
  const std::vector<Case> cases = {
      {" --encoder-seq-length 64 --vocab-extra-ids 100", "--decoder-seq-length"},
      {" --decoder-seq-length 24 --vocab-extra-ids 100", "needs --encoder-seq-length"},
      {" --seq-length 64 --encoder-seq-length 64 --decoder-seq-length 24 --vocab-extra-ids 100", "not both"},
      {" --encoder-seq-length 64 --decoder-seq-length 24", "--vocab-extra-ids"},
      {" --encoder-seq-length 2 --decoder-seq-length 24 --vocab-extra-ids 100", "too short"},
  };
  for (const auto& c : cases) {
    auto r = run_cli("inspect-data" + base + c.flags);
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.flags << "\n" << r.output;
  }
}

TEST(T5InspectCli, DataWithoutSentenceSplittingWarns) {
  // As Megatron, T5 takes documents of one sentence (each a sample cut to the target length), but
  // says that the data look preprocessed without --split-sentences.
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "vocab.txt");
  const auto prefix = (dir / "d").string();
  megatron::testing::write_sentence_dataset(prefix, {.documents = 60, .max_sentences = 1, .max_sentence_length = 90});
  auto r = run_cli("inspect-data --samples 2 --dataset-type t5 --format json --data-path " + q(prefix) +
                   " --split 80,10,10 --train-iters 2 --eval-iters 1 --encoder-seq-length 32"
                   " --decoder-seq-length 16 --vocab-extra-ids 100 --tokenizer-type BertWordPieceLowerCase"
                   " --vocab-file " + q(dir / "vocab.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("without --split-sentences"), std::string::npos) << r.output;
  EXPECT_EQ(json_lines(r.output).size(), 2u) << r.output;
}
