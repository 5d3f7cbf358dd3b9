// What Megatron's masked datasets (MaskedWordPieceDataset in megatron/core/datasets/
// masked_dataset.py: BERT, T5) share: the config's data and masking flags, the sample index of a
// split's documents with its cache, the sentences of a sample read and checked against the
// vocabulary, blends of samples and the train/valid/test build.
//
// Cache: <cache>/<md5>-<class>-description.txt and <cache>/<md5>-<class>-sample_index.npy (uint32
// [n, 3]; uint64 with more than 2^32-1 sentences), where <cache> is --data-cache-path or
// PREFIX/cache/<class>_indices and <md5> hashes the JSON description. A cache that is corrupt or
// describes something else is rebuilt.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/blended_builder.h"
#include "data/gpt_indices.h"
#include "data/indexed_dataset.h"
#include "data/masked_lm.h"
#include "data/masked_sample_index.h"

namespace megatron::data {

// The flags of MaskedWordPieceDatasetConfig every masked family takes (pretrain_bert.py,
// pretrain_t5.py); a family's config adds its lengths.
struct MaskedDataConfig {
  std::vector<std::string> data_path;  // --data-path
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";    // --split (Megatron's legacy default)
  uint32_t seed = 1234;                // --seed
  std::string data_cache_path;         // --data-cache-path
  std::string tokenizer;               // identifier recorded in the cache description
  double mid_level_dataset_surplus = 0.005;
  bool use_cache = true;
  double mask_prob = 0.15;             // --mask-prob
  double short_seq_prob = 0.1;         // --short-seq-prob
  // From the tokenizer (wordpiece_vocab): special ids, sentinels, "##" pieces, and the vocabulary
  // size that random replacements draw from and that dataset dtypes must hold.
  std::shared_ptr<const WordPieceVocab> vocab;
};

// A train, valid or test split of one family: one dataset or a blend of several.
template <class Sample>
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // Sample k (0 <= k < size()); throws megatron::Error outside, for ids outside the vocabulary,
  // and for what the family cannot build.
  virtual Sample sample(int64_t k) const = 0;
};

class MaskedDatasetIndex {
 public:
  // `documents`: the split's documents [lo, hi), not empty. num_samples nullopt: one epoch.
  // `description`: the dataset's unique description (dataset_description plus the family's keys).
  // `cache_root`: --data-cache-path, "" for PREFIX/cache/<class>_indices; nullopt: no cache.
  MaskedDatasetIndex(const IndexedDataset& data, Split split, std::pair<int64_t, int64_t> documents,
                     std::optional<int64_t> num_samples, const std::string& class_name,
                     const nlohmann::ordered_json& description, const MaskedSampleIndexParams& params,
                     const std::optional<std::string>& cache_root);

  const MaskedSampleIndex& sample_index() const { return index_; }
  const std::string& description() const { return description_; }
  const std::string& description_hash() const { return hash_; }
  // Where the cache file with this suffix is (or would be); "" when caching is off.
  std::string cache_file(const std::string& suffix) const;
  bool loaded_from_cache() const { return from_cache_; }

 private:
  bool try_load_cache(const IndexedDataset& data, const MaskedSampleIndexParams& params);
  void write_cache() const;

  std::string class_name_;
  std::pair<int64_t, int64_t> documents_;
  std::optional<int64_t> num_samples_;
  MaskedSampleIndex index_;
  std::string description_, hash_, cache_dir_;
  bool from_cache_ = false;
};

// The sentences [beg, end) of `data` as int64 ids; throws megatron::Error for an id outside
// [0, vocab_size) (Megatron would fail on inv_vocab[id]): data made with another tokenizer.
std::vector<std::vector<int64_t>> read_sentences(const IndexedDataset& data, int64_t beg, int64_t end,
                                                 int64_t vocab_size);

// The checks MaskedWordPieceDatasetConfig makes (and the sample mapping's C int seed), for
// `family` ("BERT", "T5"): --mask-prob in (0, 1), --short-seq-prob in [0, 1], --seed in
// [1, 2^31-2]. Throws megatron::Error naming the flag.
void check_masking_flags(double mask_prob, double short_seq_prob, uint32_t seed, const char* family);

// Megatron's BlendedDataset over one family's sample sources (see BlendedDataset in
// gpt_dataset.h): Sample has an optional dataset_id that the blend sets (Megatron adds
// "dataset_id" to the sample dict).
template <class Sample>
class BlendedSamples : public SampleSource<Sample> {
 public:
  using Parts = std::vector<std::shared_ptr<const SampleSource<Sample>>>;
  // `size` samples interleaved by the normalised weights; throws megatron::Error when a component
  // would be asked for more samples than it has.
  BlendedSamples(Parts parts, const std::vector<double>& weights, int64_t size)
      : parts_(std::move(parts)), map_(component_sizes(parts_), weights, size) {}
  // Every sample of every part (weights = their sizes).
  explicit BlendedSamples(Parts parts) : parts_(std::move(parts)), map_(component_sizes(parts_)) {}

  int64_t size() const override { return map_.size(); }
  Sample sample(int64_t k) const override {
    const auto [d, j] = map_.locate(k);
    Sample s = parts_[size_t(d)]->sample(j);
    s.dataset_id = d;
    return s;
  }

 private:
  Parts parts_;
  BlendMap map_;
};

// The train, valid and test splits of one family (null where a split is not built), as the
// family's train_valid_test_datasets_provider: Dataset(data, split, documents, num_samples, config,
// split_string, split_matrix) per mid-level dataset, blended by BlendedSamples. num_samples:
// per split; negative: one epoch.
template <class Dataset, class Sample, class Config>
std::array<std::shared_ptr<const SampleSource<Sample>>, 3> build_masked_datasets(const Config& c,
                                                                                 std::array<int64_t, 3> num_samples) {
  using Source = SampleSource<Sample>;
  DatasetFamily<Source> family;
  family.unit = SplitUnit::Documents;
  family.make = [&c](const MidLevelRequest& r) -> std::shared_ptr<const Source> {
    return std::make_shared<const Dataset>(r.data, r.split, r.range, r.num_samples, c, r.split_string,
                                           r.split_matrix);
  };
  family.blend = [](std::vector<std::shared_ptr<const Source>> parts, const std::optional<std::vector<double>>& weights,
                    int64_t size) -> std::shared_ptr<const Source> {
    if (!weights) return std::make_shared<const BlendedSamples<Sample>>(std::move(parts));
    return std::make_shared<const BlendedSamples<Sample>>(std::move(parts), *weights, size);
  };
  return build_blended_datasets(data_sources(c, c.vocab->size()), num_samples, family);
}

}  // namespace megatron::data
