// Megatron's BlendedMegatronDatasetBuilder (blended_megatron_dataset_builder.py), generic over a
// dataset family: GPT datasets (data_builder.h) and the masked BERT datasets (bert_dataset.h) are
// built from the same flags by the same rules.
//   --data-path P                 one mid-level dataset per split, [round(lo*M), round(hi*M)) of
//                                 the M elements (sequences for GPT, documents for BERT) by --split
//   --data-path W1 P1 W2 P2 ...   per split, each P_d built for ceil(ceil(N*w_d)*(1+surplus))
//                                 samples, blended greedily by weight to sum_d ceil(N*w_d) samples
//   --data-path P1 P2 ...         each P_d built for one epoch, blended by their sizes to
//                                 min(N, sum of sizes) samples
//   --train/valid/test-data-path  the same per split over whole datasets (split matrix (0, 1))
// A negative requested count builds one epoch (exhaustive blends).
#pragma once

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt_indices.h"
#include "data/indexed_dataset.h"

namespace megatron::data {

struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // normalised; nullopt: unweighted
};
// Megatron's get_blend_from_list. Throws megatron::Error naming `flag` for bad weights.
Blend parse_blend(const std::vector<std::string>& args, const std::string& flag);

// The data flags every dataset family shares (BlendedMegatronDatasetConfig's blend,
// blend_per_split, split and mid_level_dataset_surplus).
struct DataSources {
  std::vector<std::string> data_path;  // --data-path
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split;                   // --split
  double mid_level_dataset_surplus = 0.005;
  // The tokenizer's vocabulary size (0: unknown): a dataset whose dtype cannot hold its ids is
  // refused when opened.
  int64_t vocab_size = 0;
};

// What a family's split is counted in (Megatron's is_split_by_sequence / numel_low_level_dataset).
enum class SplitUnit { Sequences, Documents };

// One mid-level dataset the builder asks a family for.
struct MidLevelRequest {
  std::shared_ptr<const IndexedDataset> data;
  Split split = Split::Train;
  std::pair<int64_t, int64_t> range;   // the split's elements [lo, hi), never empty
  std::optional<int64_t> num_samples;  // nullopt: one epoch
  std::string split_string;            // --split as given ("" with per-split paths)
  SplitMatrix split_matrix;
};

template <class D>
struct DatasetFamily {
  SplitUnit unit = SplitUnit::Sequences;
  std::function<std::shared_ptr<const D>(const MidLevelRequest&)> make;
  // A blend of `parts`: with weights, `size` samples interleaved greedily by weight; without,
  // every sample of every part (Megatron's exhaustive blend).
  std::function<std::shared_ptr<const D>(std::vector<std::shared_ptr<const D>> parts,
                                         const std::optional<std::vector<double>>& weights, int64_t size)>
      blend;
};

// The indexed datasets one build opens, each once (several splits and blends share them).
class PrefixCache {
 public:
  // Opens PREFIX.idx/.bin; throws megatron::Error naming `flag` when they are missing or their
  // dtype cannot hold ids below vocab_size (> 0).
  std::shared_ptr<const IndexedDataset> open(const std::string& prefix, const std::string& flag,
                                             int64_t vocab_size);

 private:
  std::map<std::string, std::shared_ptr<const IndexedDataset>> open_;
};

// The blend and split flags of a family's config (GPTDataConfig, BertDataConfig).
template <class Config>
DataSources data_sources(const Config& c, int64_t vocab_size) {
  DataSources s;
  s.data_path = c.data_path;
  s.train_data_path = c.train_data_path;
  s.valid_data_path = c.valid_data_path;
  s.test_data_path = c.test_data_path;
  s.split = c.split;
  s.mid_level_dataset_surplus = c.mid_level_dataset_surplus;
  s.vocab_size = vocab_size;
  return s;
}

// The sizes of a blend's components.
template <class D>
std::vector<int64_t> component_sizes(const std::vector<std::shared_ptr<const D>>& parts) {
  std::vector<int64_t> sizes;
  for (const auto& p : parts) sizes.push_back(p->size());
  return sizes;
}

// Builds the train, valid and test datasets (null where a split is not built).
// num_samples: samples requested per split; negative: one epoch.
template <class D>
std::array<std::shared_ptr<const D>, 3> build_blended_datasets(const DataSources& sources,
                                                               std::array<int64_t, 3> num_samples,
                                                               const DatasetFamily<D>& family);

// ---- implementation ----

namespace blended_builder_detail {

inline std::optional<int64_t> count(int64_t n) { return n >= 0 ? std::optional<int64_t>(n) : std::nullopt; }

// One split of a blend (Megatron's _build_megatron_dataset_splits + BlendedDataset).
template <class D>
std::shared_ptr<const D> build_split(const DataSources& src, const DatasetFamily<D>& family, const Blend& blend,
                                     Split split, const std::string& split_string, const SplitMatrix& m, int64_t n,
                                     const std::string& flag, PrefixCache& cache) {
  const auto& bookends = m[size_t(split)];
  if (!bookends) return nullptr;
  auto make = [&](const std::string& prefix, std::optional<int64_t> samples) -> std::shared_ptr<const D> {
    auto data = cache.open(prefix, flag, src.vocab_size);
    const bool by_document = family.unit == SplitUnit::Documents;
    const int64_t elements = by_document ? data->num_documents() : data->num_sequences();
    auto range = split_range(*bookends, elements);
    if (range.first == range.second) {
      MG_REQUIRE(!samples || *samples == 0, flag, ": the ", split_name(split), " split of ", prefix, " (",
                 elements, by_document ? " documents" : " sequences", ", --split '", split_string,
                 "') is empty but samples were requested; give it a larger share or use more data");
      return nullptr;
    }
    MidLevelRequest r;
    r.data = data;
    r.split = split;
    r.range = range;
    r.num_samples = samples;
    r.split_string = split_string;
    r.split_matrix = m;
    return family.make(r);
  };
  if (blend.prefixes.size() == 1 && !blend.weights) return make(blend.prefixes[0], count(n));
  std::vector<std::shared_ptr<const D>> parts;
  if (blend.weights) {
    const auto& w = *blend.weights;
    int64_t total = 0;
    for (size_t d = 0; d < w.size(); ++d) {
      std::optional<int64_t> need;
      if (n >= 0) {
        int64_t target = int64_t(std::ceil(double(n) * w[d]));
        total += target;
        need = int64_t(std::ceil(double(target) * (1.0 + src.mid_level_dataset_surplus)));
      }
      auto p = make(blend.prefixes[d], need);
      MG_REQUIRE(p, flag, ": the ", split_name(split), " split of ", blend.prefixes[d], " is empty");
      parts.push_back(p);
    }
    if (n < 0) return family.blend(std::move(parts), std::nullopt, -1);
    return family.blend(std::move(parts), w, total);
  }
  std::vector<double> sizes;
  int64_t sum = 0;
  for (const auto& prefix : blend.prefixes) {
    auto p = make(prefix, std::nullopt);
    MG_REQUIRE(p, flag, ": the ", split_name(split), " split of ", prefix, " is empty");
    parts.push_back(p);
    sizes.push_back(double(p->size()));
    sum += p->size();
  }
  if (n < 0) return family.blend(std::move(parts), std::nullopt, -1);
  return family.blend(std::move(parts), normalize_weights(sizes), std::min(n, sum));
}

}  // namespace blended_builder_detail

template <class D>
std::array<std::shared_ptr<const D>, 3> build_blended_datasets(const DataSources& src, std::array<int64_t, 3> n,
                                                               const DatasetFamily<D>& family) {
  MG_REQUIRE(src.mid_level_dataset_surplus >= 0, "--mid-level-dataset-surplus must be >= 0");
  PrefixCache cache;
  std::array<std::shared_ptr<const D>, 3> out;
  if (!src.data_path.empty()) {
    MG_REQUIRE(src.train_data_path.empty() && src.valid_data_path.empty() && src.test_data_path.empty(),
               "--data-path cannot be combined with --train-data-path/--valid-data-path/--test-data-path");
    Blend blend = parse_blend(src.data_path, "--data-path");
    SplitMatrix m = split_matrix(parse_split(src.split, "--split"));
    for (int s = 0; s < 3; ++s)
      out[size_t(s)] = blended_builder_detail::build_split(src, family, blend, Split(s), src.split, m, n[size_t(s)],
                                                           "--data-path", cache);
    return out;
  }
  const std::vector<std::string>* paths[3] = {&src.train_data_path, &src.valid_data_path, &src.test_data_path};
  const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  bool any = false;
  for (int s = 0; s < 3; ++s) {
    if (paths[s]->empty()) continue;
    any = true;
    SplitMatrix m;
    m[size_t(s)] = std::make_pair(0.0, 1.0);
    out[size_t(s)] = blended_builder_detail::build_split(src, family, parse_blend(*paths[s], flags[s]), Split(s), "",
                                                         m, n[size_t(s)], flags[s], cache);
  }
  MG_REQUIRE(any, "no training data: give --data-path or --train-data-path/--valid-data-path/--test-data-path");
  return out;
}

}  // namespace megatron::data
