// The dataset indices' memory (data_memory.h), counted with the data layer's own arithmetic.
#include "plan/data_memory.h"

#include <cmath>
#include <memory>
#include <span>

#include "data/data_builder.h"
#include "data/gpt_indices.h"
#include "data/indexed_dataset.h"
#include "data/mock_gpt_dataset.h"

namespace megatron::plan {

namespace {

// One GPTDataset over sequences [range) of `lengths`, asked for `samples` (none: one epoch).
double split_bytes(std::span<const int32_t> lengths, std::pair<int64_t, int64_t> range,
                   std::optional<int64_t> samples, int64_t seq) {
  int64_t tokens = 0;
  for (int64_t i = range.first; i < range.second; ++i) tokens += lengths[size_t(i)];
  if (tokens <= 1) return 0;
  const int64_t epochs = data::num_epochs_for(tokens, samples, seq, 1);
  const int64_t total = (epochs * tokens - 1) / seq;
  const int64_t docs = range.second - range.first;
  return double(epochs * docs) * 4.0 + double(total + 1) * 16.0 + double(total) * 8.0;
}

struct Source {
  std::shared_ptr<const data::LowLevelDataset> data;
  double file_index_bytes = 0;  // the .idx arrays the reader keeps
};

Source open(const std::string& prefix) {
  auto d = std::make_shared<const data::IndexedDataset>(prefix);
  const double n = double(d->num_sequences());
  return {d, n * 12.0 + double(d->num_documents() + 1) * 8.0};
}

// One split over a blend: per component the samples it is asked for, plus the blend's indices.
double blend_bytes(const data::Blend& blend,
                   const std::optional<std::pair<double, double>>& bookends, int64_t n, int64_t seq,
                   std::vector<Source>& sources) {
  if (!bookends) return 0;
  double bytes = 0;
  for (size_t d = 0; d < blend.prefixes.size(); ++d) {
    if (sources.size() <= d) sources.push_back(open(blend.prefixes[d]));
    const auto& lengths = sources[d].data->sequence_lengths();
    std::optional<int64_t> samples;
    if (n >= 0 && blend.prefixes.size() == 1 && !blend.weights) samples = n;
    if (n >= 0 && blend.weights)
      samples = int64_t(std::ceil(std::ceil(double(n) * (*blend.weights)[d]) * 1.005));
    bytes +=
        split_bytes(lengths, data::split_range(*bookends, int64_t(lengths.size())), samples, seq);
  }
  if (blend.prefixes.size() > 1 || blend.weights) bytes += double(std::max<int64_t>(n, 0)) * 10.0;
  return bytes;
}

}  // namespace

double dataset_index_bytes(const training::TrainingArgs& a, int64_t gbs, int64_t train_iters) {
  const int64_t seq = a.model.seq_length;
  const std::array<int64_t, 3> n = data::train_valid_test_num_samples(
      a.train_samples > 0 ? a.train_samples : -1, train_iters, gbs, a.eval_interval, a.eval_iters);
  double bytes = 0;
  if (a.mock_data) {
    const data::MockGPTLowLevelDataset mock(0);
    const data::SplitMatrix m = data::split_matrix(data::parse_split("1,1,1"));
    for (int s = 0; s < 3; ++s)
      if (m[size_t(s)])
        bytes += split_bytes(
            mock.sequence_lengths(), data::split_range(*m[size_t(s)], mock.num_sequences()),
            n[size_t(s)] >= 0 ? std::optional<int64_t>(n[size_t(s)]) : std::nullopt, seq);
    return bytes + double(mock.num_sequences()) * 4.0;
  }
  if (!a.data.data_path.empty()) {
    const data::Blend blend = data::parse_blend(a.data.data_path, "--data-path");
    const data::SplitMatrix m = data::split_matrix(data::parse_split(a.data.split));
    std::vector<Source> sources;
    for (int s = 0; s < 3; ++s)
      bytes += blend_bytes(blend, m[size_t(s)], n[size_t(s)], seq, sources);
    for (const Source& src : sources) bytes += src.file_index_bytes;
    return bytes;
  }
  // --train-data-path / --valid-data-path / --test-data-path: whole datasets per split.
  const std::vector<std::string>* paths[3] = {&a.data.train_data_path, &a.data.valid_data_path,
                                              &a.data.test_data_path};
  const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  for (int s = 0; s < 3; ++s) {
    if (paths[s]->empty()) continue;
    const data::Blend blend = data::parse_blend(*paths[s], flags[s]);
    std::vector<Source> sources;
    bytes += blend_bytes(blend, std::make_pair(0.0, 1.0), n[size_t(s)], seq, sources);
    for (const Source& src : sources) bytes += src.file_index_bytes;
  }
  return bytes;
}

}  // namespace megatron::plan
