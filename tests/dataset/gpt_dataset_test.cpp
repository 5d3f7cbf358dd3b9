// GPTDataset sample retrieval, the index cache (hit, corruption, mismatch), blends built from
// flags, batches (loss mask, reset positions, attention_start) and sampler resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "core/error.h"
#include "data/data_builder.h"
#include "data/gpt_batch.h"
#include "data/gpt_dataset.h"
#include "data/npy.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::testing::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int32_t kEod = 0;

// Documents of random length 1..max_len holding (doc*100 + position + 1), each ending in EOD.
std::vector<std::vector<int32_t>> write_dataset(const std::string& prefix, int ndocs, int max_len, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::vector<int32_t>> docs;
  IndexedDatasetBuilder b(prefix, IndexDType::I32);
  for (int d = 0; d < ndocs; ++d) {
    int len = 1 + int(gen() % unsigned(max_len));
    std::vector<int32_t> t;
    for (int i = 0; i + 1 < len; ++i) t.push_back(d * 100 + i + 1);
    t.push_back(kEod);
    b.add_item(t);
    b.end_document();
    docs.push_back(t);
  }
  b.finalize();
  return docs;
}

GPTDataConfig config_for(const std::vector<std::string>& data_path, const std::string& cache) {
  GPTDataConfig c;
  c.data_path = data_path;
  c.split = "80,15,5";
  c.seq_length = 16;
  c.data_cache_path = cache;
  return c;
}

}  // namespace

TEST(GPTDataset, SamplesTileTheShuffledTokenStream) {
  TempDir dir;
  auto prefix = (dir / "d").string();
  auto docs = write_dataset(prefix, 40, 30, 1);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  GPTDatasetOptions o;
  o.seq_length = 16;
  o.use_cache = false;
  GPTDataset ds(data, Split::Train, {0, 40}, 100, o);
  ASSERT_GE(ds.size(), 100);
  // Concatenate the documents in document-index order; sample j (unshuffled) starts at j*S.
  std::vector<int32_t> stream;
  for (int32_t d : ds.indices().document_index) stream.insert(stream.end(), docs[size_t(d)].begin(), docs[size_t(d)].end());
  for (int64_t k = 0; k < ds.size(); ++k) {
    int64_t j = ds.indices().shuffle_index[size_t(k)];
    auto s = ds.sample(k);
    ASSERT_EQ(s.size(), 17u);
    std::vector<int32_t> expect(stream.begin() + j * 16, stream.begin() + j * 16 + 17);
    ASSERT_EQ(s, expect) << "sample " << k;
  }
  EXPECT_THROW(ds.sample(ds.size()), megatron::Error);
}

TEST(GPTDataset, LastPartialValidationSampleIsPadded) {
  TempDir dir;
  auto prefix = (dir / "d").string();
  write_dataset(prefix, 10, 20, 2);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  GPTDatasetOptions o;
  o.seq_length = 16;
  o.use_cache = false;
  o.pad_id = -1;
  o.drop_last_partial_validation_sequence = false;
  GPTDataset ds(data, Split::Valid, {0, 10}, std::nullopt, o);
  int64_t T = data->num_tokens();
  ASSERT_EQ(ds.size(), (T - 1 + 15) / 16);
  bool padded = false;
  for (int64_t k = 0; k < ds.size(); ++k) {
    auto s = ds.sample(k);
    ASSERT_EQ(s.size(), 17u);
    padded |= s.back() == -1;
  }
  EXPECT_EQ(padded, (T - 1) % 16 != 0);
}

TEST(GPTDataset, CacheIsWrittenReusedAndRebuiltWhenCorrupt) {
  TempDir dir;
  auto prefix = (dir / "d").string();
  write_dataset(prefix, 60, 30, 3);
  auto cache = (dir / "cache").string();
  auto data = std::make_shared<const IndexedDataset>(prefix);
  GPTDatasetOptions o;
  o.seq_length = 16;
  o.data_cache_path = cache;
  o.split = "1";
  GPTDataset a(data, Split::Train, {0, 60}, 50, o);
  EXPECT_FALSE(a.loaded_from_cache());
  EXPECT_EQ(fs::path(a.cache_file("sample_index.npy")).filename().string(),
            a.description_hash() + "-GPTDataset-train-sample_index.npy");
  EXPECT_EQ(a.description_hash(), md5_hex(megatron::testing::read_file(a.cache_file("description.txt"))));
  auto smp = read_npy(a.cache_file("sample_index.npy"));
  EXPECT_EQ(smp.descr, "<i4");
  EXPECT_EQ(smp.shape, (std::vector<int64_t>{a.size() + 1, 2}));
  EXPECT_EQ(read_npy(a.cache_file("shuffle_index.npy")).descr, "<u4");

  GPTDataset b(data, Split::Train, {0, 60}, 50, o);
  EXPECT_TRUE(b.loaded_from_cache());
  EXPECT_EQ(b.indices().shuffle_index, a.indices().shuffle_index);
  EXPECT_EQ(b.indices().sample_index, a.indices().sample_index);

  // Truncate one array: rebuilt, same result.
  auto shf = a.cache_file("shuffle_index.npy");
  fs::resize_file(shf, fs::file_size(shf) - 4);
  GPTDataset c(data, Split::Train, {0, 60}, 50, o);
  EXPECT_FALSE(c.loaded_from_cache());
  EXPECT_EQ(c.indices().shuffle_index, a.indices().shuffle_index);
  // Garbage in another; out-of-range values in a third.
  megatron::testing::write_file(a.cache_file("sample_index.npy"), "not numpy");
  GPTDataset d(data, Split::Train, {0, 60}, 50, o);
  EXPECT_FALSE(d.loaded_from_cache());
  std::vector<int64_t> bad(a.indices().document_index.size(), 9999);
  write_npy_i64_as(a.cache_file("document_index.npy"), "<i4", bad, {int64_t(bad.size())});
  GPTDataset e(data, Split::Train, {0, 60}, 50, o);
  EXPECT_FALSE(e.loaded_from_cache());
  EXPECT_EQ(e.indices().document_index, a.indices().document_index);
  // A different request gets a different hash.
  GPTDataset f(data, Split::Train, {0, 60}, 51, o);
  EXPECT_NE(f.description_hash(), a.description_hash());
}

TEST(GPTDataset, DefaultCacheFolderIsUnderThePrefix) {
  TempDir dir;
  auto prefix = (dir / "d").string();
  write_dataset(prefix, 20, 30, 4);
  auto c = config_for({prefix}, "");
  c.split = "1";
  auto ds = build_gpt_datasets(c, {10, 0, 0});
  EXPECT_FALSE(ds.valid);
  ASSERT_TRUE(ds.train);
  EXPECT_TRUE(fs::exists(prefix + "/cache/GPTDataset_indices"));
}

TEST(GPTDataBuilder, WeightedBlendFromFlags) {
  TempDir dir;
  auto a = (dir / "a").string(), b = (dir / "b").string();
  write_dataset(a, 200, 30, 5);
  write_dataset(b, 300, 30, 6);
  auto ds = build_gpt_datasets(config_for({"0.3", a, "0.7", b}, (dir / "c").string()), {100, 20, 5});
  ASSERT_TRUE(ds.train && ds.valid && ds.test);
  EXPECT_EQ(ds.train->size(), 30 + 70);
  int64_t from_b = 0;
  for (int64_t k = 0; k < ds.train->size(); ++k) {
    from_b += ds.train->dataset_id(k);
    EXPECT_EQ(ds.train->sample(k).size(), 17u);
  }
  EXPECT_EQ(from_b, 70);
  // Unweighted list: whole split epochs, size min(N, sum).
  auto u = build_gpt_datasets(config_for({a, b}, (dir / "c").string()), {50, 20, 5});
  EXPECT_EQ(u.train->size(), 50);
}

TEST(GPTDataBuilder, PerSplitPaths) {
  TempDir dir;
  auto a = (dir / "a").string(), b = (dir / "b").string();
  write_dataset(a, 50, 30, 7);
  write_dataset(b, 30, 30, 8);
  GPTDataConfig c;
  c.train_data_path = {a};
  c.valid_data_path = {b};
  c.seq_length = 16;
  c.use_cache = false;
  auto ds = build_gpt_datasets(c, {40, 10, 0});
  ASSERT_TRUE(ds.train && ds.valid);
  EXPECT_FALSE(ds.test);
  EXPECT_GE(ds.valid->size(), 10);
}

TEST(GPTDataBuilder, ClearErrors) {
  TempDir dir;
  auto a = (dir / "a").string();
  write_dataset(a, 20, 30, 9);
  auto expect_error = [&](GPTDataConfig c, std::array<int64_t, 3> n, const std::string& needle) {
    c.use_cache = false;
    try {
      build_gpt_datasets(c, n);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const megatron::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(config_for({(dir / "missing").string()}, ""), {10, 1, 1}, "missing.idx");
  expect_error(config_for({"0.5", a, "x", a}, ""), {10, 1, 1}, "not a number");
  expect_error(config_for({"-0.5", a, "1", a}, ""), {10, 1, 1}, "non-negative");
  auto c = config_for({a}, "");
  c.split = "abc";
  expect_error(c, {10, 1, 1}, "--split");
  c.split = "100,0.0001,0";
  expect_error(c, {10, 5, 0}, "is empty but samples were requested");
  c = config_for({a}, "");
  c.seq_length = 100000;
  expect_error(c, {10, 1, 1}, "--seq-length");
  expect_error(config_for({"1e309", a, "1", a}, ""), {10, 1, 1}, "finite, non-negative");
  // A dataset whose dtype cannot hold the tokenizer's ids (another tokenizer's, or a changed
  // dtype byte): uint8 for GPT-2's 50257 ids.
  const std::string narrow = (dir / "narrow").string();
  {
    IndexedDatasetBuilder b(narrow, IndexDType::U8);
    for (int d = 0; d < 20; ++d) {
      b.add_item(std::vector<int32_t>(30, d));
      b.end_document();
    }
    b.finalize();
  }
  c = config_for({narrow}, "");
  c.vocab_size = 50257;
  expect_error(c, {10, 1, 1}, "stores tokens as uint8, which cannot hold the ids");
  c.vocab_size = 200;
  c.use_cache = false;
  EXPECT_NO_THROW(build_gpt_datasets(c, {10, 1, 1}));
}

TEST(GPTDataBuilder, HugeBlendWeightsNormalise) {
  const auto b = parse_blend({"1e308", "a", "1e308", "b", "5e307", "c"}, "--data-path");
  ASSERT_TRUE(b.weights);
  EXPECT_DOUBLE_EQ((*b.weights)[0], 0.4);
  EXPECT_DOUBLE_EQ((*b.weights)[1], 0.4);
  EXPECT_DOUBLE_EQ((*b.weights)[2], 0.2);
  // Ordinary weights normalise exactly as before (Megatron's w / sum).
  const auto o = parse_blend({"0.3", "a", "0.7", "b"}, "--data-path");
  EXPECT_EQ((*o.weights)[0], 0.3 / (0.3 + 0.7));
}

TEST(GPTBatch, TokenIdsOutsideTheVocabularyAreAnError) {
  GPTBatchOptions o;
  o.eod_id = 63;
  o.vocab_size = 64;
  EXPECT_NO_THROW(make_gpt_batch({{1, 2, 63, 5}}, o));
  try {
    make_gpt_batch({{1, 2, 64, 5}}, o);
    ADD_FAILURE() << "no error";
  } catch (const megatron::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 64, outside the tokenizer's vocabulary of 64 ids"),
              std::string::npos) << e.what();
  }
}

TEST(GPTBatch, LossMaskPositionsAndAttentionStart) {
  // EOD = 0 at input positions 2 and 5.
  std::vector<int32_t> t = {7, 8, 0, 9, 10, 0, 11, 12, 13};
  GPTBatchOptions o;
  o.eod_id = 0;
  auto plain = make_gpt_batch({t}, o);
  EXPECT_FALSE(plain.attention_start.defined());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(plain.tokens.data<int32_t>()[i], t[size_t(i)]);
    EXPECT_EQ(plain.labels.data<int32_t>()[i], t[size_t(i + 1)]);
    EXPECT_EQ(plain.position_ids.data<int32_t>()[i], i);
    EXPECT_EQ(plain.loss_mask.data<float>()[i], 1.0f);
  }
  o.eod_mask_loss = o.reset_position_ids = o.reset_attention_mask = true;
  auto g = make_gpt_batch({t}, o);
  std::vector<float> mask = {1, 1, 0, 1, 1, 0, 1, 1};
  std::vector<int32_t> pos = {0, 1, 2, 0, 1, 2, 0, 1};
  std::vector<int32_t> start = {0, 0, 0, 3, 3, 3, 6, 6};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(g.loss_mask.data<float>()[i], mask[i]) << i;
    EXPECT_EQ(g.position_ids.data<int32_t>()[i], pos[i]) << i;
    EXPECT_EQ(g.attention_start.data<int32_t>()[i], start[i]) << i;
  }
  // Padding: labels equal to pad are masked, pads become 0.
  GPTBatchOptions p;
  p.eod_id = 0;
  p.pad_id = -1;
  auto h = make_gpt_batch({{5, 6, -1, -1}}, p);
  EXPECT_EQ(h.loss_mask.data<float>()[0], 1.0f);
  EXPECT_EQ(h.loss_mask.data<float>()[1], 0.0f);
  EXPECT_EQ(h.loss_mask.data<float>()[2], 0.0f);
  EXPECT_EQ(h.tokens.data<int32_t>()[2], 0);
  EXPECT_EQ(h.labels.data<int32_t>()[1], 0);
}

TEST(GPTBatch, SamplerResumeContinuesExactly) {
  TempDir dir;
  auto prefix = (dir / "d").string();
  write_dataset(prefix, 80, 30, 10);
  auto cfg = config_for({prefix}, (dir / "c").string());
  cfg.eod_mask_loss = true;
  auto ds = build_gpt_datasets(cfg, {64, 8, 8});
  GPTBatchOptions o = batch_options(cfg);
  EXPECT_TRUE(o.eod_mask_loss);
  EXPECT_EQ(o.eod_id, kEod);
  for (int rank = 0; rank < 2; ++rank) {
    PretrainingSampler straight(*ds.train, 0, 2, rank, 2, o);
    std::vector<std::vector<int64_t>> ids;
    std::vector<std::vector<int32_t>> toks;
    while (straight.has_next()) {
      auto b = straight.next();
      ids.push_back(b.sample_ids);
      toks.emplace_back(b.tokens.data<int32_t>(), b.tokens.data<int32_t>() + b.tokens.numel());
    }
    ASSERT_EQ(int64_t(ids.size()), ds.train->size() / 4);
    EXPECT_EQ(ids[1], (std::vector<int64_t>{4 + 2 * rank, 5 + 2 * rank}));
    PretrainingSampler first(*ds.train, 0, 2, rank, 2, o);
    for (int i = 0; i < 3; ++i) first.next();
    PretrainingSampler resumed(*ds.train, first.consumed_samples(), 2, rank, 2, o);
    for (size_t i = 3; i < ids.size(); ++i) {
      auto b = resumed.next();
      EXPECT_EQ(b.sample_ids, ids[i]);
      EXPECT_EQ(std::vector<int32_t>(b.tokens.data<int32_t>(), b.tokens.data<int32_t>() + b.tokens.numel()), toks[i]);
    }
    EXPECT_FALSE(resumed.has_next());
    EXPECT_THROW(resumed.next(), megatron::Error);
  }
}
