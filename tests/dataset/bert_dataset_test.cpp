// Megatron's BERT masked dataset: the sample mapping, the masking and whole samples against
// tests/reference/megatron_bert_dataset.py (Megatron's algorithm transcribed to Python with
// NumPy's RandomState), for several seeds, both binary-head settings, two sequence lengths,
// several epochs, blends and splits; the index cache; batches; and the errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bert_test_data.h"
#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/bert_wordpiece.h"
#include "data/npy.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::testing::ask_bert_reference;
using megatron::testing::error_of;
using megatron::testing::expect_same_samples;
using megatron::testing::TempDir;
using nlohmann::json;

namespace {

struct BertData {
  TempDir dir;
  std::string vocab_file = (dir / "vocab.txt").string();
  std::string a = (dir / "a_text_sentence").string(), b = (dir / "b_text_sentence").string();
  std::shared_ptr<const WordPieceVocab> vocab;
  BertData() {
    megatron::testing::write_bert_vocab(vocab_file);
    megatron::testing::write_sentence_dataset(a, {.documents = 150, .seed = 3});
    megatron::testing::write_sentence_dataset(b, {.documents = 90, .max_sentence_length = 70, .seed = 4});
    vocab = std::make_shared<const WordPieceVocab>(wordpiece_vocab(BertWordPieceTokenizer(vocab_file, true)));
  }
  BertDataConfig config(uint32_t seed, bool binary_head, int64_t seq_length) const {
    BertDataConfig c;
    megatron::testing::set_masked_data(c, a, seed, vocab, dir.path());
    c.seq_length = seq_length;
    c.binary_head = binary_head;
    return c;
  }
  json request(const BertDataConfig& c, std::array<int64_t, 3> n, const std::string& split, int64_t count) const {
    json r = megatron::testing::masked_samples_request(c, vocab_file, n, split, count);
    r["seq_length"] = c.seq_length;
    r["binary_head"] = c.binary_head;
    return r;
  }
};

json samples_json(const BertSampleSource& d, int64_t count) {
  return megatron::testing::samples_as_json(d, count, bert_sample_json);
}

}  // namespace

TEST(NumpyRandomDraws, RandomAndRandintMatchNumpy) {
  std::vector<json> reqs;
  json calls = json::array();
  for (int i = 0; i < 40; ++i)
    calls.push_back(i % 3 == 0 ? json::array({"random"}) : json::array({"randint", i % 5, 7 + i * 1000 * (i % 4)}));
  calls.push_back(json::array({"randint", 3, 4}));  // a one-value range draws nothing
  calls.push_back(json::array({"random"}));
  for (uint32_t seed : {0u, 1234u, 4294967295u}) reqs.push_back({{"op", "draws"}, {"seed", seed}, {"calls", calls}});
  auto ans = ask_bert_reference(reqs);
  ASSERT_EQ(ans.size(), reqs.size());
  for (size_t r = 0; r < reqs.size(); ++r) {
    NumpyRandomState rng(reqs[r]["seed"].get<uint32_t>());
    for (size_t i = 0; i < calls.size(); ++i) {
      const json& want = ans[r]["values"][i];
      if (calls[i][0] == "random")
        EXPECT_EQ(rng.random(), want.get<double>()) << "call " << i;
      else
        EXPECT_EQ(rng.randint(calls[i][1], calls[i][2]), want.get<int64_t>()) << "call " << i;
    }
  }
}

TEST(MaskedLm, NgramBinsMatchNumpyChoice) {
  std::vector<json> reqs;
  for (int n = 1; n <= 7; ++n) reqs.push_back({{"op", "cdf"}, {"max_ngram", n}});
  auto ans = ask_bert_reference(reqs);
  ASSERT_EQ(ans.size(), reqs.size());
  for (int n = 1; n <= 7; ++n) {
    auto cdf = ngram_cdf(n, n, false);
    ASSERT_EQ(cdf.size(), size_t(n));
    for (int i = 0; i < n; ++i) {
      char hex[64];
      std::snprintf(hex, sizeof hex, "%a", cdf[size_t(i)]);
      EXPECT_EQ(std::stod(ans[size_t(n - 1)]["cdf"][size_t(i)].get<std::string>()), cdf[size_t(i)])
          << "max_ngram " << n << " bin " << i << " (ours " << hex << ")";
    }
  }
}

TEST(MaskedSampleIndex, WorkedExample) {
  // Sentence lengths [2 3 4 1 1] | [7] | [3 600] (see masked_sample_index.h).
  const std::vector<int32_t> sizes = {2, 3, 4, 1, 1, 7, 3, 600};
  const std::vector<int64_t> docs = {0, 5, 6, 8};
  MaskedSampleIndexParams p;
  p.max_length = 6;
  p.min_sentences = 2;
  auto rows_of = [](const MaskedSampleIndex& m) {
    std::vector<std::array<int64_t, 3>> r;
    for (int64_t k = 0; k < m.size(); ++k) r.push_back(m.row(k));
    std::sort(r.begin(), r.end());
    return r;
  };
  auto m = build_masked_sample_index(docs, sizes, p);
  EXPECT_EQ(rows_of(m), (std::vector<std::array<int64_t, 3>>{{0, 3, 6}, {3, 5, 6}}));
  EXPECT_EQ(m.one_sentence_documents, 1);
  EXPECT_EQ(m.long_sentence_documents, 1);
  p.min_sentences = 1;
  EXPECT_EQ(rows_of(build_masked_sample_index(docs, sizes, p)),
            (std::vector<std::array<int64_t, 3>>{{0, 3, 6}, {3, 5, 6}, {5, 6, 6}}));
  // Whole epochs until the count is reached: 5 samples need three epochs of two.
  p.min_sentences = 2;
  p.num_samples = 5;
  auto three = build_masked_sample_index(docs, sizes, p);
  EXPECT_EQ(three.size(), 6);
  EXPECT_EQ(three.num_epochs, 3);
  EXPECT_FALSE(three.wide());
}

TEST(MaskedSampleIndex, MatchesMegatronLoop) {
  BertData d;
  megatron::testing::write_sentence_dataset((d.dir / "c").string(), {.documents = 400, .seed = 9});
  IndexedDataset ds((d.dir / "c").string());
  struct Case {
    std::pair<int64_t, int64_t> documents;
    std::optional<int64_t> n;
    int32_t max_length;
    double short_prob;
    int32_t seed, min_sentences;
  };
  const std::vector<Case> cases = {
      {{0, 400}, 100, 125, 0.1, 1234, 2}, {{0, 400}, std::nullopt, 29, 0.1, 7, 1},
      {{37, 381}, 5000, 29, 0.1, 99, 2},  {{0, 400}, 3000, 61, 0.0, 1234, 1},
      {{10, 20}, 700, 13, 1.0, 5, 2},     {{0, 400}, 0, 125, 0.1, 1234, 2},
      {{0, 400}, 1000, 509, 0.33, 2147483646, 2},
  };
  std::vector<json> reqs;
  for (const auto& c : cases)
    reqs.push_back({{"op", "mapping"},      {"prefix", (d.dir / "c").string()},
                    {"documents", {c.documents.first, c.documents.second}},
                    {"num_samples", c.n ? json(*c.n) : json(nullptr)},
                    {"max_length", c.max_length}, {"short_seq_prob", c.short_prob},
                    {"seed", c.seed},       {"min_sentences", c.min_sentences}});
  auto ans = ask_bert_reference(reqs);
  ASSERT_EQ(ans.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    MaskedSampleIndexParams p{c.max_length, c.short_prob, c.seed, c.min_sentences, c.n};
    auto m = build_masked_sample_index(
        ds.document_indices().subspan(size_t(c.documents.first), size_t(c.documents.second - c.documents.first + 1)),
        ds.sequence_lengths(), p);
    json rows = json::array();
    for (int64_t k = 0; k < m.size(); ++k) rows.push_back(m.row(k));
    EXPECT_EQ(rows, ans[i]["rows"]) << "case " << i;
    if (c.n) {
      EXPECT_GE(m.size(), *c.n) << "case " << i;
    }
  }
}

TEST(BertDataset, SamplesMatchMegatron) {
  BertData d;
  std::vector<json> reqs;
  std::vector<BertDataConfig> configs;
  const std::array<int64_t, 3> n = {120, 30, 10};
  for (uint32_t seed : {1234u, 5u, 31337u})
    for (bool head : {true, false})
      for (int64_t seq : {32, 128}) {
        auto c = d.config(seed, head, seq);
        if (seed == 5u) c.mask_prob = 0.3;
        if (seed == 31337u) c.short_seq_prob = 0.5;
        configs.push_back(c);
        reqs.push_back(d.request(c, n, "train", 40));
      }
  auto ans = ask_bert_reference(reqs);
  ASSERT_EQ(ans.size(), configs.size());
  int64_t truncated = 0, random = 0, masked_random_ids = 0;
  for (size_t i = 0; i < configs.size(); ++i) {
    auto ds = build_bert_datasets(configs[i], n);
    ASSERT_TRUE(ds.train);
    EXPECT_EQ(ds.train->size(), ans[i]["size"].get<int64_t>()) << "case " << i;
    auto got = samples_json(*ds.train, 40);
    expect_same_samples(got, ans[i]["samples"], "case " + std::to_string(i));
    for (const auto& s : got) {
      truncated += s["truncated"].get<int64_t>();
      random += s["is_random"].get<int64_t>();
      for (size_t t = 0; t < s["text"].size(); ++t)
        masked_random_ids += s["loss_mask"][t] == 1 && s["text"][t] != s["labels"][t] && s["text"][t] != 4;
    }
  }
  // The cases reach every branch: truncation, swapped segments, random replacements.
  EXPECT_GT(truncated, 20);
  EXPECT_GT(random, 20);
  EXPECT_GT(masked_random_ids, 20);
}

TEST(BertDataset, MultiEpochMatchesMegatron) {
  BertData d;
  auto c = d.config(1234, true, 64);
  // One epoch of the train split gives a few hundred samples: ask for several epochs' worth.
  auto one = build_bert_datasets(c, {-1, -1, -1});
  const int64_t per_epoch = one.train->size();
  ASSERT_GT(per_epoch, 50);
  const std::array<int64_t, 3> n = {per_epoch * 3 + 7, 5, 5};
  auto ans = ask_bert_reference({d.request(c, n, "train", 60)});
  auto ds = build_bert_datasets(c, n);
  EXPECT_EQ(ds.train->size(), ans[0]["size"].get<int64_t>());
  EXPECT_GE(ds.train->size(), n[0]);
  const auto& idx = dynamic_cast<const BertMaskedWordPieceDataset&>(*ds.train).sample_index();
  EXPECT_GE(idx.num_epochs, 3);
  expect_same_samples(samples_json(*ds.train, 60), ans[0]["samples"], "multi-epoch");
}

TEST(BertDataset, BlendsAndSplitsMatchMegatron) {
  BertData d;
  auto blended = d.config(77, true, 48);
  blended.data_path = {"0.3", d.a, "0.7", d.b};
  blended.split = "80,15,5";
  auto per_split = d.config(77, false, 48);
  per_split.data_path.clear();
  per_split.train_data_path = {d.a};
  per_split.valid_data_path = {d.b};
  const std::array<int64_t, 3> n = {200, 40, 12};
  auto ans = ask_bert_reference({d.request(blended, n, "train", 30), d.request(blended, n, "valid", 30),
                                 d.request(blended, n, "test", 12), d.request(per_split, n, "valid", 30)});
  ASSERT_EQ(ans.size(), 4u);
  auto b = build_bert_datasets(blended, n);
  ASSERT_TRUE(b.train && b.valid && b.test);
  EXPECT_EQ(b.train->size(), ans[0]["size"].get<int64_t>());
  EXPECT_EQ(b.valid->size(), ans[1]["size"].get<int64_t>());
  expect_same_samples(samples_json(*b.train, 30), ans[0]["samples"], "blend train");
  expect_same_samples(samples_json(*b.valid, 30), ans[1]["samples"], "blend valid");
  expect_same_samples(samples_json(*b.test, 12), ans[2]["samples"], "blend test");
  EXPECT_EQ(json::parse(bert_sample_json(b.train->sample(0))).begin().key(), "dataset_id");
  auto p = build_bert_datasets(per_split, n);
  ASSERT_TRUE(p.train && p.valid);
  EXPECT_FALSE(p.test);
  EXPECT_EQ(p.valid->size(), ans[3]["size"].get<int64_t>());
  expect_same_samples(samples_json(*p.valid, 30), ans[3]["samples"], "per-split valid");
}

TEST(BertDataset, CachesTheSampleIndexAsMegatron) {
  BertData d;
  auto c = d.config(1234, true, 64);
  c.data_cache_path.clear();  // next to the data, as Megatron
  auto first = build_bert_datasets(c, {100, 10, 10});
  const auto& ds = dynamic_cast<const BertMaskedWordPieceDataset&>(*first.train);
  EXPECT_FALSE(ds.loaded_from_cache());
  const auto dir = std::filesystem::path(d.a) / "cache" / "BERTMaskedWordPieceDataset_indices";
  const auto npy = dir / (ds.description_hash() + "-BERTMaskedWordPieceDataset-sample_index.npy");
  EXPECT_EQ(ds.cache_file("sample_index.npy"), npy.string());
  auto a = read_npy(npy.string());
  EXPECT_EQ(a.descr, "<u4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{ds.size(), 3}));
  EXPECT_EQ(a.values, ds.sample_index().rows());
  const auto desc = json::parse(megatron::testing::read_file(
      dir / (ds.description_hash() + "-BERTMaskedWordPieceDataset-description.txt")));
  std::vector<std::string> keys;
  for (auto it = desc.begin(); it != desc.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> want = {"class", "dataset_path", "num_samples", "index_split", "random_seed",
                                   "sequence_length", "split", "split_matrix", "tokenizer",
                                   "masking_probability", "short_sequence_probability", "masking_max_ngram",
                                   "masking_do_full_word", "masking_do_permutation", "masking_use_longer_ngrams",
                                   "masking_use_geometric_distribution", "classification_head"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(keys, want);
  EXPECT_EQ(desc["class"], "BERTMaskedWordPieceDataset");
  EXPECT_EQ(desc["index_split"], "train");
  EXPECT_EQ(desc["num_samples"], 100);
  EXPECT_EQ(desc["classification_head"], true);
  // A second build loads the index; a corrupt one is rebuilt to the same samples.
  auto second = build_bert_datasets(c, {100, 10, 10});
  EXPECT_TRUE(dynamic_cast<const BertMaskedWordPieceDataset&>(*second.train).loaded_from_cache());
  EXPECT_EQ(samples_json(*second.train, 10), samples_json(*first.train, 10));
  auto rows = ds.sample_index().rows();
  rows[1] = 1 << 30;
  write_npy_i64_as(npy.string(), "<u4", rows, {ds.size(), 3});
  auto third = build_bert_datasets(c, {100, 10, 10});
  EXPECT_FALSE(dynamic_cast<const BertMaskedWordPieceDataset&>(*third.train).loaded_from_cache());
  EXPECT_EQ(samples_json(*third.train, 10), samples_json(*first.train, 10));
}

TEST(BertDataset, BatchStacksSamplesAsGetBatch) {
  BertData d;
  auto ds = build_bert_datasets(d.config(1234, true, 32), {50, 10, 10});
  const std::vector<int64_t> ids = {3, 0, 17};
  auto batch = make_bert_batch(*ds.train, ids);
  ASSERT_EQ(batch.tokens.shape(), (megatron::Shape{3, 32}));
  EXPECT_EQ(batch.tokens.dtype(), megatron::DType::I32);
  EXPECT_EQ(batch.loss_mask.dtype(), megatron::DType::F32);
  ASSERT_EQ(batch.is_random.shape(), (megatron::Shape{3}));
  for (size_t r = 0; r < ids.size(); ++r) {
    auto s = ds.train->sample(ids[r]);
    for (size_t i = 0; i < 32; ++i) {
      const size_t o = r * 32 + i;
      EXPECT_EQ(batch.tokens.data<int32_t>()[o], s.text[i]);
      EXPECT_EQ(batch.types.data<int32_t>()[o], s.types[i]);
      EXPECT_EQ(batch.labels.data<int32_t>()[o], s.labels[i]);
      EXPECT_EQ(batch.padding_mask.data<int32_t>()[o], s.padding_mask[i]);
      EXPECT_EQ(batch.loss_mask.data<float>()[o], float(s.loss_mask[i]));
    }
    EXPECT_EQ(batch.is_random.data<int32_t>()[r], s.is_random);
  }
  EXPECT_EQ(batch.sample_ids, ids);
}

TEST(BertDataset, ClearErrors) {
  BertData d;
  auto c = d.config(1234, true, 64);
  // Documents of one sentence each: what preprocess-data writes without --split-sentences.
  const auto flat = (d.dir / "flat_text_document").string();
  megatron::testing::write_sentence_dataset(flat, {.documents = 40, .max_sentences = 1, .seed = 5});
  c.data_path = {flat};
  c.split = "1";
  auto msg = error_of([&] { build_bert_datasets(c, {10, 2, 2}); });
  EXPECT_NE(msg.find("--split-sentences"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--bert-no-binary-head"), std::string::npos) << msg;
  EXPECT_NE(msg.find(flat), std::string::npos) << msg;
  c.binary_head = false;
  EXPECT_GE(build_bert_datasets(c, {10, 0, 0}).train->size(), 10);
  // Documents whose sentences are all too long.
  const auto longs = (d.dir / "long").string();
  megatron::testing::write_sentence_dataset(longs, {.documents = 20, .long_sentence_rate = 1.0, .seed = 6});
  c = d.config(1234, true, 64);
  c.data_path = {longs};
  msg = error_of([&] { build_bert_datasets(c, {10, 2, 2}); });
  EXPECT_NE(msg.find("longer than 512"), std::string::npos) << msg;
  // Settings Megatron cannot use.
  c = d.config(1234, true, 4);
  EXPECT_NE(error_of([&] { build_bert_datasets(c, {10, 2, 2}); }).find("--seq-length"), std::string::npos);
  c = d.config(0, true, 64);
  EXPECT_NE(error_of([&] { build_bert_datasets(c, {10, 2, 2}); }).find("--seed"), std::string::npos);
  c = d.config(1234, true, 64);
  c.mask_prob = 1.0;
  EXPECT_NE(error_of([&] { build_bert_datasets(c, {10, 2, 2}); }).find("--mask-prob"), std::string::npos);
  c.mask_prob = 0.15;
  c.short_seq_prob = -0.1;
  EXPECT_NE(error_of([&] { build_bert_datasets(c, {10, 2, 2}); }).find("--short-seq-prob"), std::string::npos);
  c.short_seq_prob = 0.1;
  c.vocab = nullptr;
  EXPECT_NE(error_of([&] { build_bert_datasets(c, {10, 2, 2}); }).find("vocabulary"), std::string::npos);
  // A tokenizer that is not WordPiece.
  NullTokenizer null(1000);
  EXPECT_NE(error_of([&] { wordpiece_vocab(null); }).find("WordPiece"), std::string::npos);
  // Ids outside the vocabulary (data made with another tokenizer).
  const auto other = (d.dir / "other").string();
  {
    IndexedDatasetBuilder b(other, IndexDType::U16);
    for (int doc = 0; doc < 30; ++doc) {
      const std::vector<int32_t> t = {5, 6, 7, 300, 8, 9};
      const std::vector<int32_t> len = {3, 3};
      b.add_document(t, len);
    }
    b.finalize();
  }
  c = d.config(1234, true, 64);
  c.data_path = {other};
  auto ds = build_bert_datasets(c, {10, 2, 2});
  msg = error_of([&] { ds.train->sample(0); });
  EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocabulary"), std::string::npos) << msg;
  // A split too small for the samples asked of it.
  c = d.config(1234, true, 64);
  c.split = "998,1,1";
  msg = error_of([&] { build_bert_datasets(c, {10, 2, 2}); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  EXPECT_NE(msg.find("documents"), std::string::npos) << msg;
}
