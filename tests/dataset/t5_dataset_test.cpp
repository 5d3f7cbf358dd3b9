// Megatron's T5 span-corruption dataset against tests/reference/megatron_t5_dataset.py (Megatron's
// algorithm transcribed to Python with NumPy's RandomState): NumPy's geometric draws, whole samples
// for several seeds, two (encoder, decoder) length pairs, several epochs, blends and splits; the
// tokenizer's sentinels; batches and the local-implementation attention masks; the errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bert_test_data.h"
#include "core/error.h"
#include "data/bert_wordpiece.h"
#include "data/t5_dataset.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::DType;
using megatron::Tensor;
using megatron::testing::error_of;
using megatron::testing::expect_same_samples;
using megatron::testing::TempDir;
using nlohmann::json;

namespace {

constexpr const char* kScript = "megatron_t5_dataset.py";

std::vector<json> ask(const std::vector<json>& requests) {
  return megatron::testing::ask_bert_reference(requests, kScript);
}

struct T5Data {
  TempDir dir;
  std::string vocab_file = (dir / "vocab.txt").string();
  std::string a = (dir / "a_text_sentence").string(), b = (dir / "b_text_sentence").string();
  BertWordPieceTokenizer tokenizer;
  std::shared_ptr<const WordPieceVocab> vocab;
  T5Data()
      : tokenizer((megatron::testing::write_bert_vocab(dir / "vocab.txt"), vocab_file), true, 100),
        vocab(std::make_shared<const WordPieceVocab>(wordpiece_vocab(tokenizer))) {
    megatron::testing::write_sentence_dataset(a, {.documents = 150, .seed = 3});
    megatron::testing::write_sentence_dataset(b, {.documents = 90, .max_sentence_length = 70, .seed = 4});
  }
  T5DataConfig config(uint32_t seed, int64_t encoder, int64_t decoder) const {
    T5DataConfig c;
    megatron::testing::set_masked_data(c, a, seed, vocab, dir.path());
    c.encoder_seq_length = encoder;
    c.decoder_seq_length = decoder;
    return c;
  }
  json request(const T5DataConfig& c, std::array<int64_t, 3> n, const std::string& split, int64_t count) const {
    json r = megatron::testing::masked_samples_request(c, vocab_file, n, split, count);
    r["vocab_extra_ids"] = int64_t(c.vocab->sentinels.size());
    r["encoder_seq_length"] = c.encoder_seq_length;
    r["decoder_seq_length"] = c.decoder_seq_length;
    return r;
  }
};

json samples_json(const T5SampleSource& d, int64_t count) {
  return megatron::testing::samples_as_json(d, count, t5_sample_json);
}

}  // namespace

TEST(T5Dataset, GeometricDrawsMatchNumpy) {
  std::vector<json> reqs;
  for (uint32_t seed : {1u, 1234u, 4000000000u})
    for (double p : {0.2, 0.5, 0.05}) reqs.push_back({{"op", "geometric"}, {"seed", seed}, {"p", p}, {"count", 3000}});
  auto ans = ask(reqs);
  ASSERT_EQ(ans.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    NumpyRandomState rng(reqs[i]["seed"].get<uint32_t>());
    std::vector<int64_t> got;
    for (int k = 0; k < 3000; ++k) got.push_back(rng.geometric(reqs[i]["p"].get<double>()));
    EXPECT_EQ(json(got), ans[i]["values"]) << reqs[i].dump();
  }
}

TEST(T5Dataset, SentinelsAreMegatronsExtraIds) {
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "plain.txt");
  // <extra_id_1> and [EOS] already in the file keep their ids; the others are appended in order.
  megatron::testing::write_file(dir / "some.txt",
                                "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nw0\n<extra_id_1>\n##x\n[EOS]\nw1\n");
  std::vector<json> reqs;
  const std::vector<std::pair<std::string, int>> cases = {{"plain.txt", 100}, {"plain.txt", 1}, {"some.txt", 3}};
  for (const auto& [file, n] : cases)
    reqs.push_back({{"op", "vocab"}, {"vocab_file", (dir / file).string()}, {"vocab_extra_ids", n}});
  auto ans = ask(reqs);
  ASSERT_EQ(ans.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i)
    for (bool lower : {true, false}) {
      BertWordPieceTokenizer tok((dir / cases[i].first).string(), lower, cases[i].second);
      EXPECT_EQ(tok.vocab_size(), ans[i]["size"].get<int64_t>()) << i;
      EXPECT_EQ(json(tok.extra_ids()), ans[i]["additional_special_tokens_ids"]) << i;
      const WordPieceVocab v = wordpiece_vocab(tok);
      EXPECT_EQ(json(v.sentinels), ans[i]["additional_special_tokens_ids"]) << i;
      EXPECT_EQ(v.bos, ans[i]["bos"].get<int32_t>()) << i;
      EXPECT_EQ(v.eos, ans[i]["eos"].get<int32_t>()) << i;
    }
  // The plain vocabulary: 105 tokens, [BOS] 105, [EOS] 106, <extra_id_k> 107 + k.
  BertWordPieceTokenizer tok((dir / "plain.txt").string(), true, 100);
  EXPECT_EQ(tok.vocab_size(), 207);
  EXPECT_EQ(tok.extra_ids().front(), 107);
  EXPECT_EQ(tok.token(206), "<extra_id_99>");
}

TEST(T5Dataset, SamplesMatchMegatron) {
  T5Data d;
  std::vector<json> reqs;
  std::vector<T5DataConfig> configs;
  const std::array<int64_t, 3> n = {150, 30, 10};
  for (uint32_t seed : {1234u, 5u, 31337u})
    for (auto [enc, dec] : {std::pair<int64_t, int64_t>{64, 24}, {128, 48}}) {
      auto c = d.config(seed, enc, dec);
      if (seed == 5u) {
        c.mask_prob = 0.25;
        c.decoder_seq_length = 1 + 2 * int64_t(0.25 * double(enc - 2));
      }
      if (seed == 31337u) c.short_seq_prob = 0.5;
      configs.push_back(c);
      reqs.push_back(d.request(c, n, "train", 150));
    }
  auto ans = ask(reqs);
  ASSERT_EQ(ans.size(), configs.size());
  int64_t truncated = 0, multi_token_spans = 0, encoder_padding = 0;
  for (size_t i = 0; i < configs.size(); ++i) {
    auto ds = build_t5_datasets(configs[i], n);
    ASSERT_TRUE(ds.train);
    EXPECT_EQ(ds.train->size(), ans[i]["size"].get<int64_t>()) << "case " << i;
    auto got = samples_json(*ds.train, 150);
    expect_same_samples(got, ans[i]["samples"], "case " + std::to_string(i));
    for (const auto& s : got) {
      truncated += s["truncated"].get<int64_t>();
      encoder_padding += s["enc_mask"].back() == 0;
      // A span of several tokens: a label after a label (not a sentinel, ids >= 107).
      for (size_t t = 1; t < s["labels"].size(); ++t)
        multi_token_spans += s["labels"][t].get<int64_t>() >= 0 && s["labels"][t].get<int64_t>() < 105 &&
                             s["labels"][t - 1].get<int64_t>() < 105;
    }
  }
  // The cases reach truncation, long spans (geometric lengths, whole words) and padding.
  EXPECT_GT(truncated, 20);
  EXPECT_GT(multi_token_spans, 100);
  EXPECT_GT(encoder_padding, 20);
}

TEST(T5Dataset, MultiEpochBlendsAndSplitsMatchMegatron) {
  T5Data d;
  auto c = d.config(42, 64, 24);
  auto one = build_t5_datasets(c, {-1, -1, -1});
  const int64_t per_epoch = one.train->size();
  ASSERT_GT(per_epoch, 50);
  const std::array<int64_t, 3> n = {per_epoch * 3 + 7, 5, 5};
  auto blended = d.config(77, 128, 48);
  blended.data_path = {"0.3", d.a, "0.7", d.b};
  blended.split = "80,15,5";
  auto per_split = d.config(78, 96, 40);
  per_split.data_path.clear();
  per_split.train_data_path = {d.a};
  per_split.valid_data_path = {d.b};
  const std::array<int64_t, 3> nb = {200, 40, 12};
  auto ans = ask({d.request(c, n, "train", 80), d.request(blended, nb, "train", 40),
                  d.request(blended, nb, "valid", 40), d.request(blended, nb, "test", 12),
                  d.request(per_split, nb, "valid", 30)});
  ASSERT_EQ(ans.size(), 5u);
  auto ds = build_t5_datasets(c, n);
  EXPECT_EQ(ds.train->size(), ans[0]["size"].get<int64_t>());
  EXPECT_GE(dynamic_cast<const T5MaskedWordPieceDataset&>(*ds.train).sample_index().num_epochs, 3);
  // The last samples come from the later epochs.
  json got = json::array(), want = json::array();
  for (int64_t k = 0; k < 80; ++k) got.push_back(json::parse(t5_sample_json(ds.train->sample(k))));
  expect_same_samples(got, ans[0]["samples"], "multi-epoch");
  auto b = build_t5_datasets(blended, nb);
  ASSERT_TRUE(b.train && b.valid && b.test);
  expect_same_samples(samples_json(*b.train, 40), ans[1]["samples"], "blend train");
  expect_same_samples(samples_json(*b.valid, 40), ans[2]["samples"], "blend valid");
  expect_same_samples(samples_json(*b.test, 12), ans[3]["samples"], "blend test");
  EXPECT_EQ(json::parse(t5_sample_json(b.train->sample(0))).begin().key(), "dataset_id");
  auto p = build_t5_datasets(per_split, nb);
  ASSERT_TRUE(p.valid);
  expect_same_samples(samples_json(*p.valid, 30), ans[4]["samples"], "per-split valid");
}

TEST(T5Dataset, CacheIsMegatrons) {
  T5Data d;
  auto c = d.config(9, 64, 24);
  auto first = build_t5_datasets(c, {100, 10, 5});
  const auto& ds = dynamic_cast<const T5MaskedWordPieceDataset&>(*first.train);
  EXPECT_FALSE(ds.loaded_from_cache());
  const auto description = json::parse(megatron::testing::read_file(ds.cache_file("description.txt")));
  EXPECT_EQ(description["class"], "T5MaskedWordPieceDataset");
  EXPECT_EQ(description["masking_max_ngram"], 10);
  EXPECT_EQ(description["masking_use_geometric_distribution"], true);
  EXPECT_EQ(description["sequence_length"], 64);
  EXPECT_EQ(description["sequence_length_decoder"], 24);
  EXPECT_EQ(std::filesystem::path(ds.cache_file("sample_index.npy")).filename().string(),
            ds.description_hash() + "-T5MaskedWordPieceDataset-sample_index.npy");
  auto second = build_t5_datasets(c, {100, 10, 5});
  const auto& again = dynamic_cast<const T5MaskedWordPieceDataset&>(*second.train);
  EXPECT_TRUE(again.loaded_from_cache());
  EXPECT_EQ(again.sample_index().rows(), ds.sample_index().rows());
  EXPECT_EQ(t5_sample_json(again.sample(3)), t5_sample_json(ds.sample(3)));
}

TEST(T5Dataset, BatchAndLocalMasksAsGetBatch) {
  T5Data d;
  auto ds = build_t5_datasets(d.config(1234, 64, 24), {50, 5, 5});
  const std::vector<int64_t> ids = {3, 0, 17};
  T5Batch batch = make_t5_batch(*ds.train, ids);
  EXPECT_EQ(batch.tokens_enc.shape(), (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(batch.tokens_dec.shape(), (std::vector<int64_t>{3, 24}));
  EXPECT_EQ(batch.labels.dtype(), DType::I32);
  EXPECT_EQ(batch.loss_mask.dtype(), DType::F32);
  json enc = json::array(), dec = json::array();
  for (size_t r = 0; r < ids.size(); ++r) {
    const T5Sample s = ds.train->sample(ids[r]);
    for (size_t i = 0; i < 64; ++i) {
      ASSERT_EQ(batch.tokens_enc.data<int32_t>()[r * 64 + i], s.text_enc[i]);
      ASSERT_EQ(batch.enc_mask.data<int32_t>()[r * 64 + i], s.enc_mask[i]);
    }
    for (size_t i = 0; i < 24; ++i) {
      ASSERT_EQ(batch.tokens_dec.data<int32_t>()[r * 24 + i], s.text_dec[i]);
      ASSERT_EQ(batch.labels.data<int32_t>()[r * 24 + i], s.labels[i]);
      ASSERT_EQ(batch.loss_mask.data<float>()[r * 24 + i], float(s.loss_mask[i]));
      ASSERT_EQ(batch.dec_mask.data<int32_t>()[r * 24 + i], s.dec_mask[i]);
    }
    enc.push_back(s.text_enc);
    dec.push_back(s.text_dec);
  }
  auto want = ask({{{"op", "local_masks"}, {"tokens_enc", enc}, {"tokens_dec", dec}}});
  ASSERT_EQ(want.size(), 1u);
  const T5AttentionMasks m = t5_local_attention_masks(batch);
  auto as_json = [](const Tensor& t) {
    const auto& s = t.shape();
    json out = json::array();
    for (int64_t b = 0; b < s[0]; ++b) {
      json rows = json::array();
      for (int64_t i = 0; i < s[2]; ++i) {
        json row = json::array();
        for (int64_t j = 0; j < s[3]; ++j) row.push_back(int(t.data<uint8_t>()[(b * s[2] + i) * s[3] + j]));
        rows.push_back(row);
      }
      out.push_back(json::array({rows}));
    }
    return out;
  };
  EXPECT_EQ(as_json(m.enc_mask), want[0]["enc_mask"]);
  EXPECT_EQ(as_json(m.dec_mask), want[0]["dec_mask"]);
  EXPECT_EQ(as_json(m.enc_dec_mask), want[0]["enc_dec_mask"]);
}

TEST(T5Dataset, ClearErrors) {
  T5Data d;
  auto expect_error = [](const T5DataConfig& c, const std::string& needle, std::array<int64_t, 3> n = {20, 5, 5}) {
    auto msg = error_of([&] {
      auto ds = build_t5_datasets(c, n);
      for (int64_t k = 0; k < ds.train->size(); ++k) ds.train->sample(k);
    });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  auto no_sentinels = d.config(1, 64, 24);
  no_sentinels.vocab = std::make_shared<const WordPieceVocab>(
      wordpiece_vocab(BertWordPieceTokenizer(d.vocab_file, true, 0)));
  expect_error(no_sentinels, "--vocab-extra-ids");
  // Two sentinels for samples that mask up to 18 spans: Megatron's deque runs out.
  auto few = d.config(1, 128, 48);
  few.vocab = std::make_shared<const WordPieceVocab>(wordpiece_vocab(BertWordPieceTokenizer(d.vocab_file, true, 2)));
  expect_error(few, "raise --vocab-extra-ids to at least floor(--mask-prob * (--encoder-seq-length - 2)) = 18");
  expect_error(d.config(1, 128, 6), "raise --decoder-seq-length");
  expect_error(d.config(1, 3, 24), "--encoder-seq-length 3 is too short");
  expect_error(d.config(1, 64, 2), "--decoder-seq-length 2 is too short");
  auto prob = d.config(1, 64, 24);
  prob.mask_prob = 0;
  expect_error(prob, "--mask-prob");
  auto no_vocab = d.config(1, 64, 24);
  no_vocab.vocab = nullptr;
  expect_error(no_vocab, "vocabulary");
  // Another kind of tokenizer has no WordPiece vocabulary (Megatron's T5 dataset assumes one).
  NullTokenizer null_tok(1000);
  auto msg = error_of([&] { wordpiece_vocab(null_tok); });
  EXPECT_NE(msg.find("WordPiece"), std::string::npos) << msg;
  // Ids beyond the vocabulary: data made with another tokenizer.
  auto small = d.config(1, 64, 24);
  auto v = std::make_shared<WordPieceVocab>(*d.vocab);
  v->continuation.resize(60);
  small.vocab = v;
  expect_error(small, "outside the tokenizer's vocabulary");
}
