// Megatron's mid- and top-level GPT datasets (megatron/core/datasets/gpt_dataset.py,
// blended_dataset.py). A GPTDataset is one split of one indexed dataset: its document, sample and
// shuffle indices (gpt_indices.h) are built once and cached as .npy files named by the MD5 of a
// JSON description, like Megatron's `<md5>-GPTDataset-<split>-*.npy`; a cache that is corrupt or
// describes something else is rebuilt. sample(k) returns the S+1 tokens of sample k, right-padded
// with the pad id when the last sample is short. A BlendedDataset interleaves several by weight.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/gpt_indices.h"
#include "data/indexed_dataset.h"

namespace megatron::data {

// Anything that yields fixed-length token samples.
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  // S+1 token ids of sample k (0 <= k < size()); short samples are padded with pad_id.
  virtual std::vector<int32_t> sample(int64_t k) const = 0;
  // For a blend: which component sample k came from (0 for a single dataset).
  virtual int64_t dataset_id(int64_t k) const { (void)k; return 0; }
};

struct GPTDatasetOptions {
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  std::string split;            // the --split string as given (part of the cache description)
  SplitMatrix split_matrix;     // book-ends (part of the cache description)
  std::string data_cache_path;  // empty: <prefix>/cache/GPTDataset_indices
  std::string tokenizer;        // tokenizer identifier for the cache description
  int32_t pad_id = -1;
  bool drop_last_partial_validation_sequence = true;
  bool use_cache = true;
};

class GPTDataset : public SampleDataset {
 public:
  // `split_range`: the split's sequence ids [lo, hi). num_samples nullopt: one epoch.
  GPTDataset(std::shared_ptr<const LowLevelDataset> data, Split split, std::pair<int64_t, int64_t> split_range,
             std::optional<int64_t> num_samples, const GPTDatasetOptions& options);

  int64_t size() const override { return indices_.num_samples(); }
  std::vector<int32_t> sample(int64_t k) const override;

  const GPTIndices& indices() const { return indices_; }
  // The JSON description whose MD5 names the cache files, and that MD5.
  const std::string& description() const { return description_; }
  const std::string& description_hash() const { return hash_; }
  // Where the cache files are (or would be) for this dataset; "" when caching is off.
  std::string cache_file(const std::string& suffix) const;
  bool loaded_from_cache() const { return from_cache_; }

 private:
  bool try_load_cache();
  void write_cache() const;

  std::shared_ptr<const LowLevelDataset> data_;
  Split split_;
  GPTDatasetOptions options_;
  GPTIndices indices_;
  std::string description_, hash_, cache_dir_;
  bool from_cache_ = false;
};

class BlendedDataset : public SampleDataset {
 public:
  // weights: normalised; size: samples in the blend. Throws megatron::Error when a component
  // would be asked for more samples than it has.
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                 int64_t size);
  // Exhaustive blend over whole components (weights = their lengths).
  explicit BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets);

  int64_t size() const override { return map_.size(); }
  std::vector<int32_t> sample(int64_t k) const override;
  int64_t dataset_id(int64_t k) const override { return map_.locate(k).first; }
  const BlendingIndices& blending_indices() const { return map_.indices(); }

 private:
  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  BlendMap map_;
};

// RFC 1321 MD5 as lowercase hex (names cache files as hashlib.md5(...).hexdigest() does).
std::string md5_hex(const std::string& bytes);

// The keys every Megatron dataset's description starts with, in order (MegatronDataset's
// unique_identifiers: class, dataset_path, num_samples, index_split, then the config's
// random_seed, sequence_length, split, split_matrix, tokenizer); a family appends its own keys,
// and dump(4) is the description whose MD5 names the cache files.
nlohmann::ordered_json dataset_description(const std::string& class_name, const std::string& dataset_path,
                                           std::optional<int64_t> num_samples, Split split, uint32_t seed,
                                           int64_t sequence_length, const std::string& split_string,
                                           const SplitMatrix& split_matrix, const std::string& tokenizer);
// Index caches as Megatron keeps them (one folder, files `<md5>-<class>-...`), the steps every
// dataset family shares. load_index_cache: false when a file is missing; otherwise checks that
// the description file holds `description` and runs `load` (which reads the arrays and throws on
// anything amiss); a failure is a warning naming `files_pattern`, and the caller rebuilds.
bool load_index_cache(const std::vector<std::string>& files, const std::string& description_file,
                      const std::string& description, const std::string& files_pattern,
                      const std::function<void()>& load);
// Creates `dir`, runs `write` (the arrays), then writes the description file atomically: its
// presence marks a complete cache. A failure is a warning; the run goes on without a cache.
void write_index_cache(const std::string& dir, const std::string& description_file, const std::string& description,
                       const std::function<void()>& write);

}  // namespace megatron::data
