// Small WordPiece vocabularies and sentence-split indexed datasets for the BERT and T5 dataset tests:
// documents of 0..9 sentences, words with "##" pieces (some at a sentence's start, some after a
// [SEP] boundary), [UNK]/[MASK] inside the text, and a few sentences over 512 tokens, so every
// rule of Megatron's sample mapping and masking is exercised.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/masked_dataset.h"
#include "test_util.h"

namespace megatron::testing {

// [PAD] [UNK] [CLS] [SEP] [MASK], 60 words, 40 "##" pieces: 105 tokens (Megatron's tokenizer adds
// [BOS] 105 and [EOS] 106).
constexpr int32_t kBertWords = 60, kBertPieces = 40, kBertFirstWord = 5;
inline void write_bert_vocab(const std::filesystem::path& path) {
  std::string v = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (int i = 0; i < kBertWords; ++i) v += "w" + std::to_string(i) + "\n";
  for (int i = 0; i < kBertPieces; ++i) v += "##p" + std::to_string(i) + "\n";
  write_file(path, v);
}

struct SentenceDataOptions {
  int documents = 120;
  int max_sentences = 9;        // 0 .. max per document
  int max_sentence_length = 40;
  double long_sentence_rate = 0.01;  // sentences of 513..600 tokens
  uint32_t seed = 1;
};

// Writes PREFIX.bin/.idx (uint16), one sequence per sentence.
inline void write_sentence_dataset(const std::string& prefix, const SentenceDataOptions& o = {}) {
  std::mt19937 gen(o.seed);
  auto uniform = [&](int lo, int hi) { return lo + int(gen() % uint32_t(hi - lo + 1)); };
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  for (int d = 0; d < o.documents; ++d) {
    const int sentences = uniform(0, o.max_sentences);
    std::vector<int32_t> tokens, lengths;
    for (int s = 0; s < sentences; ++s) {
      const bool is_long = uniform(0, 9999) < int(o.long_sentence_rate * 10000);
      const int n = is_long ? uniform(513, 600) : uniform(1, o.max_sentence_length);
      for (int t = 0; t < n; ++t) {
        const int r = uniform(0, 99);
        if (r < 30)
          tokens.push_back(kBertFirstWord + kBertWords + uniform(0, kBertPieces - 1));  // "##" piece
        else if (r < 32)
          tokens.push_back(r == 30 ? 1 : 4);  // [UNK], [MASK]
        else
          tokens.push_back(kBertFirstWord + uniform(0, kBertWords - 1));
      }
      lengths.push_back(n);
    }
    b.add_document(tokens, lengths);
  }
  b.finalize();
}

// Runs every request through tests/reference/<script> (megatron_bert_dataset.py, or
// megatron_t5_dataset.py) in one process.
inline std::vector<nlohmann::json> ask_bert_reference(const std::vector<nlohmann::json>& requests,
                                                      const std::string& script_name = "megatron_bert_dataset.py") {
  TempDir dir;
  std::string in;
  for (auto& r : requests) in += r.dump() + "\n";
  write_file(dir / "req.jsonl", in);
  const auto script = (source_dir() / "tests/reference" / script_name).string();
  const auto res = run_command("/usr/bin/python3 '" + script + "' < '" + (dir / "req.jsonl").string() + "'");
  EXPECT_EQ(res.exit_code, 0) << res.output;
  std::vector<nlohmann::json> out;
  std::istringstream is(res.output);
  for (std::string line; std::getline(is, line);) out.push_back(nlohmann::json::parse(line));
  EXPECT_EQ(out.size(), requests.size()) << res.output;
  return out;
}

// Compares sample dicts one by one so that a failure names the first sample and key that differ.
inline void expect_same_samples(const nlohmann::json& got, const nlohmann::json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    for (auto it = want[k].begin(); it != want[k].end(); ++it)
      ASSERT_EQ(got[k][it.key()], it.value()) << what << ": sample " << k << " key " << it.key();
  EXPECT_EQ(got, want) << what;
}

// The test data's settings every masked dataset (BERT, T5) shares: `prefix` split 90/7/3, the
// WordPiece vocabulary, the index cache in `dir`/cache.
inline void set_masked_data(data::MaskedDataConfig& c, const std::string& prefix, uint32_t seed,
                            std::shared_ptr<const data::WordPieceVocab> vocab,
                            const std::filesystem::path& dir) {
  c.data_path = {prefix};
  c.split = "90,7,3";
  c.seed = seed;
  c.tokenizer = "BertWordPieceLowerCase";
  c.vocab = std::move(vocab);
  c.data_cache_path = (dir / "cache").string();
}

// A "samples" request of the reference scripts: the shared keys of `c` and the split's sample
// count; the family adds its own (sequence lengths, binary head, sentinels).
inline nlohmann::json masked_samples_request(const data::MaskedDataConfig& c, const std::string& vocab_file,
                                             std::array<int64_t, 3> n, const std::string& split,
                                             int64_t count) {
  nlohmann::json r = {{"op", "samples"},      {"vocab_file", vocab_file},
                      {"seed", c.seed},       {"mask_prob", c.mask_prob},
                      {"short_seq_prob", c.short_seq_prob}, {"num_samples", n},
                      {"split", c.split},     {"split_name", split},
                      {"count", count},       {"surplus", c.mid_level_dataset_surplus}};
  if (!c.data_path.empty()) r["data_path"] = c.data_path;
  if (!c.valid_data_path.empty()) r["valid_data_path"] = c.valid_data_path;
  return r;
}

// The first `count` samples of `source` as the JSON dicts `to_json` writes.
template <class Source, class ToJson>
nlohmann::json samples_as_json(const Source& source, int64_t count, ToJson to_json) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t k = 0; k < count; ++k) out.push_back(nlohmann::json::parse(to_json(source.sample(k))));
  return out;
}

}  // namespace megatron::testing
