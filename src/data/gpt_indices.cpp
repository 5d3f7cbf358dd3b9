// See gpt_indices.h. Each function follows the Megatron code path named beside it.
#include "data/gpt_indices.h"

#include <algorithm>

#include <cfenv>
#include <cmath>
#include <limits>
#include <regex>
#include <set>

#include "core/error.h"
#include "data/numpy_random.h"

namespace megatron::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

std::vector<double> normalize_weights(std::span<const double> weights) {
  double sum = 0;
  for (double w : weights) {
    MG_REQUIRE(std::isfinite(w) && w >= 0, "weight ", w, " is negative or not finite; weights must be >= 0");
    sum += w;
  }
  MG_REQUIRE(sum > 0, "weights sum to 0; give at least one positive weight");
  std::vector<double> out;
  if (!std::isfinite(sum)) {
    // Finite weights whose sum overflows (1e308 + 1e308): scale by the largest first. Only then,
    // so that ordinary weights normalise exactly as Megatron's numpy code does.
    double largest = 0;
    for (double w : weights) largest = std::max(largest, w);
    sum = 0;
    for (double w : weights) sum += w / largest;
    for (double w : weights) out.push_back(w / largest / sum);
    return out;
  }
  for (double w : weights) out.push_back(w / sum);
  return out;
}

std::array<double, 3> parse_split(const std::string& split, const std::string& flag) {
  std::regex number("[.0-9]+");
  std::vector<double> values;
  for (auto it = std::sregex_iterator(split.begin(), split.end(), number); it != std::sregex_iterator(); ++it) {
    const std::string tok = it->str();
    char* end = nullptr;
    double v = std::strtod(tok.c_str(), &end);
    MG_REQUIRE(end && *end == 0 && tok != ".", flag, " '", split, "': '", tok, "' is not a number (expected e.g. 949,50,1)");
    values.push_back(v);
  }
  MG_REQUIRE(!values.empty() && values.size() <= 3, flag, " '", split,
             "' must hold one to three non-negative numbers (train,valid,test), e.g. 949,50,1");
  while (values.size() < 3) values.push_back(0.0);
  double sum = values[0] + values[1] + values[2];
  MG_REQUIRE(sum > 0, flag, " '", split, "' sums to 0; give at least one positive part");
  return {values[0] / sum, values[1] / sum, values[2] / sum};
}

SplitMatrix split_matrix(const std::array<double, 3>& f) {
  SplitMatrix m;
  double lo = 0.0;
  for (int i = 0; i < 3; ++i) {
    double hi = lo + f[size_t(i)];
    if (hi - lo != 0) m[size_t(i)] = std::make_pair(lo, hi);
    lo = hi;
  }
  return m;
}

std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& b, int64_t n) {
  // Python's round(): half to even, which is nearbyint under the default rounding mode.
  MG_CHECK(std::fegetround() == FE_TONEAREST);
  return {int64_t(std::nearbyint(b.first * double(n))), int64_t(std::nearbyint(b.second * double(n)))};
}

int64_t num_epochs_for(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t seq_length,
                       int64_t add_extra_token) {
  if (!num_samples) return 1;
  MG_CHECK(tokens_per_epoch > 0);
  int64_t need = *num_samples * seq_length + add_extra_token;
  int64_t epochs = 1, tokens = tokens_per_epoch;
  while (tokens < need) {
    tokens += tokens_per_epoch;
    ++epochs;
  }
  return epochs;
}

// gpt_dataset.py _build_document_index: tile the split E times and shuffle once.
static std::vector<int32_t> document_index_for(std::span<const int32_t> docs, int64_t epochs,
                                               NumpyRandomState& rng) {
  std::vector<int32_t> out;
  out.reserve(docs.size() * size_t(epochs));
  for (int64_t e = 0; e < epochs; ++e) out.insert(out.end(), docs.begin(), docs.end());
  rng.shuffle(std::span<int32_t>(out));
  return out;
}

// helpers.cpp build_sample_idx.
std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes, std::span<const int32_t> doc_idx,
                                        int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last, int64_t extra) {
  int64_t total = num_epochs * tokens_per_epoch - extra;
  int64_t num_samples = drop_last ? total / seq_length : (total + seq_length - 1) / seq_length;
  std::vector<int64_t> idx(size_t(2 * (num_samples + 1)));
  int64_t s = 0, d = 0, offset = 0;
  idx[0] = 0;
  idx[1] = 0;
  ++s;
  const int64_t ndoc = int64_t(doc_idx.size());
  while (s <= num_samples) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      int64_t doc_len = int64_t(sizes[size_t(doc_idx[size_t(d)])]) - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - extra;
        remaining = 0;
      } else {
        if (d == ndoc - 1) {
          MG_CHECK(s == num_samples, "sample index ran out of documents at sample ", s, " of ", num_samples);
          offset = int64_t(sizes[size_t(doc_idx[size_t(d)])]) - extra;
          break;
        }
        ++d;
        offset = 0;
      }
    }
    idx[size_t(2 * s)] = d;
    idx[size_t(2 * s + 1)] = offset;
    ++s;
  }
  return idx;
}

// gpt_dataset.py _build_shuffle_index.
static std::vector<int64_t> shuffle_index_for(int64_t num_samples, int64_t total, NumpyRandomState& rng) {
  std::vector<int64_t> first(static_cast<size_t>(num_samples));
  for (int64_t i = 0; i < num_samples; ++i) first[size_t(i)] = i;
  rng.shuffle(std::span<int64_t>(first));
  if (num_samples == total) return first;
  std::vector<int64_t> last(size_t(total - num_samples));
  for (int64_t i = num_samples; i < total; ++i) last[size_t(i - num_samples)] = i;
  rng.shuffle(std::span<int64_t>(last));
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

GPTIndices build_gpt_indices(std::span<const int32_t> lengths, std::span<const int32_t> split,
                             const GPTIndexParams& p) {
  MG_REQUIRE(p.seq_length > 0, "--seq-length must be positive (got ", p.seq_length, ")");
  int64_t T = 0;
  for (int32_t i : split) {
    MG_CHECK(i >= 0 && size_t(i) < lengths.size(), "split index ", i, " out of range");
    T += lengths[size_t(i)];
  }
  MG_REQUIRE(T >= p.seq_length + p.add_extra_token, "the split holds ", T, " tokens in ", split.size(),
             " sequences, fewer than one sample of --seq-length ", p.seq_length, " needs (", p.seq_length + p.add_extra_token,
             "); use more data, a shorter --seq-length, or a larger share in --split");
  GPTIndices out;
  out.num_epochs = num_epochs_for(T, p.num_samples, p.seq_length, p.add_extra_token);
  int64_t before_last = 0;
  if (out.num_epochs > 1) {
    before_last = ((out.num_epochs - 1) * T - p.add_extra_token) / p.seq_length;
    int64_t from_last = *p.num_samples - before_last;
    int64_t per_epoch = (T - p.add_extra_token) / p.seq_length;
    MG_CHECK(from_last >= 0 && from_last <= per_epoch + 1);
    out.separate_final_epoch = from_last < int64_t(0.80 * double(per_epoch));
  }
  NumpyRandomState rng(p.seed);
  if (!out.separate_final_epoch) {
    out.document_index = document_index_for(split, out.num_epochs, rng);
  } else {
    out.document_index = document_index_for(split, out.num_epochs - 1, rng);
    auto last = document_index_for(split, 1, rng);
    out.document_index.insert(out.document_index.end(), last.begin(), last.end());
  }
  out.sample_index = build_sample_index(lengths, out.document_index, p.seq_length, out.num_epochs, T,
                                        p.drop_last_partial_sequence, p.add_extra_token);
  int64_t n = int64_t(out.sample_index.size() / 2) - 1;
  out.shuffle_index = shuffle_index_for(out.separate_final_epoch ? before_last : n, n, rng);
  return out;
}

// w*t - count exactly as two roundings (no fused multiply-add, which -march=native would allow),
// so ties resolve like Megatron's helpers.cpp.
static double blend_error(double w, double t, int64_t count) {
  volatile double product = w * t;
  return product - double(count);
}

// helpers.cpp build_blending_indices.
BlendingIndices build_blending_indices(std::span<const double> w, int64_t size) {
  BlendingIndices b;
  b.dataset_index.resize(size_t(size));
  b.dataset_sample_index.resize(size_t(size));
  std::vector<int64_t> count(w.size(), 0);
  for (int64_t t = 0; t < size; ++t) {
    double td = std::max(double(t), 1.0);
    size_t best = 0;
    double best_err = blend_error(w[0], td, count[0]);
    for (size_t d = 1; d < w.size(); ++d) {
      double err = blend_error(w[d], td, count[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    b.dataset_index[size_t(t)] = int16_t(best);
    b.dataset_sample_index[size_t(t)] = count[best]++;
  }
  return b;
}

// helpers.cpp build_exhaustive_blending_indices.
BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::vector<double> w;
  for (int64_t s : sizes) w.push_back(double(s) / double(total));
  std::set<size_t> unspent;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] > 0) unspent.insert(d);
  std::vector<int64_t> count(sizes.size(), 0);
  BlendingIndices b;
  for (int64_t t = 0; !unspent.empty(); ++t) {
    double td = std::max(double(t), 1.0);
    size_t best = 0;
    double best_err = std::numeric_limits<double>::lowest();
    for (size_t d : unspent) {
      double err = blend_error(w[d], td, count[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    b.dataset_index.push_back(int16_t(best));
    b.dataset_sample_index.push_back(count[best]++);
    if (count[best] == sizes[best]) unspent.erase(best);
  }
  return b;
}

BlendMap::BlendMap(std::span<const int64_t> sizes, std::span<const double> weights, int64_t size) {
  MG_CHECK(!sizes.empty() && sizes.size() == weights.size() && sizes.size() <= 32767);
  indices_ = build_blending_indices(weights, size);
  std::vector<int64_t> need(sizes.size(), 0);
  for (size_t t = 0; t < indices_.dataset_index.size(); ++t) {
    const size_t d = size_t(indices_.dataset_index[t]);
    need[d] = std::max(need[d], indices_.dataset_sample_index[t] + 1);
  }
  for (size_t d = 0; d < sizes.size(); ++d)
    MG_REQUIRE(need[d] <= sizes[d], "blended dataset needs ", need[d], " samples from component ", d,
               " which has only ", sizes[d], "; raise --mid-level-dataset-surplus");
}

BlendMap::BlendMap(std::span<const int64_t> sizes) {
  MG_CHECK(!sizes.empty() && sizes.size() <= 32767);
  indices_ = build_exhaustive_blending_indices(sizes);
}

std::pair<int64_t, int64_t> BlendMap::locate(int64_t k) const {
  MG_REQUIRE(k >= 0 && k < size(), "sample ", k, " is outside the blended dataset (", size(), " samples)");
  return {indices_.dataset_index[size_t(k)], indices_.dataset_sample_index[size_t(k)]};
}

}  // namespace megatron::data
