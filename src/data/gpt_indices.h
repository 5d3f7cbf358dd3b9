// Megatron's GPT dataset index construction as pure functions over arrays
// (megatron/core/datasets/gpt_dataset.py, helpers.cpp, utils.py, blended_megatron_dataset_builder.py):
// split strings and their cumulative "book-ends", the number of epochs and the separate-last-epoch
// rule, the shuffled document index, the sample index (S+1 tokens per sample, consecutive samples
// sharing one token), the shuffle index, and the greedy blending indices. Every shuffle uses the
// NumPy legacy RandomState (numpy_random.h) in Megatron's order so the result is bit-identical.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megatron::data {

enum class Split { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split s);  // "train", "valid", "test"

// "949,50,1" -> normalised fractions (numbers found by [.0-9]+, padded with zeros to three).
// Throws megatron::Error naming `flag` when there is no number, more than three, or they sum to 0.
std::array<double, 3> parse_split(const std::string& split, const std::string& flag = "--split");
// Cumulative book-ends; a zero-width split is nullopt.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix split_matrix(const std::array<double, 3>& fractions);
// Element range [round(lo*M), round(hi*M)) (Python round: half to even) of one split.
std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& bookends, int64_t num_elements);

struct GPTIndexParams {
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  std::optional<int64_t> num_samples;  // nullopt: one epoch
  bool drop_last_partial_sequence = true;
  int64_t add_extra_token = 1;
};

struct GPTIndices {
  int64_t num_epochs = 1;
  bool separate_final_epoch = false;
  std::vector<int32_t> document_index;  // sequence ids, shuffled
  std::vector<int64_t> sample_index;    // [num_samples+1, 2] row-major: (doc_pos, offset)
  std::vector<int64_t> shuffle_index;   // [num_samples]
  int64_t num_samples() const { return int64_t(shuffle_index.size()); }
};

// `sequence_lengths`: all sequences of the low-level dataset; `split_indices`: the split's sequence
// ids, ascending. Throws megatron::Error when the split holds too few tokens for one sample.
GPTIndices build_gpt_indices(std::span<const int32_t> sequence_lengths,
                             std::span<const int32_t> split_indices, const GPTIndexParams& params);

// Building blocks (exposed for tests).
int64_t num_epochs_for(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t seq_length,
                       int64_t add_extra_token);
std::vector<int64_t> build_sample_index(std::span<const int32_t> sequence_lengths,
                                        std::span<const int32_t> document_index, int64_t seq_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last_partial_sequence, int64_t add_extra_token);

// Greedy blending: for t < size pick argmax_d(w_d*max(t,1) - count_d), ties to the lowest d.
struct BlendingIndices {
  std::vector<int16_t> dataset_index;
  std::vector<int64_t> dataset_sample_index;
};
BlendingIndices build_blending_indices(std::span<const double> weights, int64_t size);
// Exhaustive variant: weights len_d/sum, dataset d leaves once it gave len_d samples.
BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes);

// Which component, and which of its samples, each sample of a blend is (Megatron's
// BlendedDataset indices), for any kind of component.
class BlendMap {
 public:
  // `size` samples by the normalised weights; throws megatron::Error when component d would be
  // asked for more than component_sizes[d] samples.
  BlendMap(std::span<const int64_t> component_sizes, std::span<const double> weights, int64_t size);
  // Every sample of every component (exhaustive).
  explicit BlendMap(std::span<const int64_t> component_sizes);
  int64_t size() const { return int64_t(indices_.dataset_index.size()); }
  // (component, its sample) of sample k; throws megatron::Error outside the blend.
  std::pair<int64_t, int64_t> locate(int64_t k) const;
  const BlendingIndices& indices() const { return indices_; }

 private:
  BlendingIndices indices_;
};
// w / sum(w); throws on negative weights or a zero sum.
std::vector<double> normalize_weights(std::span<const double> weights);

}  // namespace megatron::data
