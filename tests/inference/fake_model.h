// Test doubles for the generation engine: a LanguageModel whose logits are a pure function of
// each row's whole prefix. Its "KV cache" is the prefix itself, so it checks the contract
// (positions advance by `n`, rows never mix, reorder moves rows) without any real network.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/error.h"
#include "inference/language_model.h"

namespace megatron::inference::testing {

using LogitsFn = std::function<void(std::span<const int32_t> prefix, std::span<float> logits)>;

// Pseudo-random logits in [-4, 4) from a hash of the prefix.
inline void hashed_logits(std::span<const int32_t> prefix, std::span<float> logits) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int32_t t : prefix) h = (h ^ uint64_t(uint32_t(t))) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  for (size_t v = 0; v < logits.size(); ++v) {
    uint64_t z = h + 0x9E3779B97F4A7C15ull * (v + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    logits[v] = float(double(z >> 11) / 9007199254740992.0 * 8.0 - 4.0);
  }
}

class FakeModel final : public LanguageModel {
 public:
  FakeModel(int64_t width, int64_t max_len, LogitsFn fn = hashed_logits)
      : width_(width), max_len_(max_len), fn_(std::move(fn)) {}
  int64_t vocab_size() const override { return width_; }
  int64_t max_sequence_length() const override { return max_len_; }
  void start(int64_t batch, int64_t max_len) override {
    MG_CHECK(max_len <= max_len_, "cache longer than the model allows");
    rows_.assign(size_t(batch), {});
    cache_len_ = max_len;
    ++starts;
  }
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override {
    const int64_t b = int64_t(rows_.size());
    MG_CHECK(int64_t(tokens.size()) == b * n, "forward: ", tokens.size(), " tokens for ", b, "x", n);
    MG_CHECK(position() + n <= cache_len_, "forward past the cache");
    const int64_t out_n = all_positions ? n : 1;
    Tensor logits = Tensor::empty({b, out_n, width_}, DType::F32);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < n; ++j) {
        rows_[i].push_back(tokens[i * n + j]);
        if (all_positions || j == n - 1) {
          const int64_t o = all_positions ? j : 0;
          fn_(rows_[i], std::span<float>(logits.data<float>() + (i * out_n + o) * width_, width_));
        }
      }
    forwarded_tokens += b * n;
    ++forwards;
    return logits;
  }
  void reorder(std::span<const int64_t> src) override {
    std::vector<std::vector<int32_t>> next;
    for (int64_t s : src) next.push_back(rows_[size_t(s)]);
    rows_ = std::move(next);
  }
  int64_t position() const override { return rows_.empty() ? 0 : int64_t(rows_[0].size()); }
  bool supports_ragged() const override { return ragged; }
  Tensor prefill_ragged(std::span<const std::vector<int32_t>> prompts, bool all_positions) override {
    MG_CHECK(ragged && prompts.size() == rows_.size(), "ragged prefill");
    int64_t longest = 0;
    for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
    const int64_t out_n = all_positions ? longest : 1, b = int64_t(prompts.size());
    Tensor logits = Tensor::zeros({b, out_n, width_}, DType::F32);
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = int64_t(prompts[size_t(i)].size());
      for (int64_t j = 0; j < n; ++j) {
        rows_[size_t(i)].push_back(prompts[size_t(i)][size_t(j)]);
        if (all_positions || j == n - 1)
          fn_(rows_[size_t(i)], std::span<float>(logits.data<float>() + (i * out_n + (all_positions ? j : 0)) * width_, width_));
      }
      forwarded_tokens += n;
    }
    ++forwards;
    return logits;
  }
  bool ragged = false;  // offer prefill_ragged

  // Slots: row s of the "cache" is slot s; a forward touches only the slots it names.
  bool supports_slots() const override { return true; }
  void start_slots(int64_t slots, int64_t max_len) override { start(slots, max_len); }
  void clear_slot(int64_t slot) override { rows_.at(size_t(slot)).clear(); }
  void grow_slots(int64_t max_len) override {
    MG_CHECK(max_len <= max_len_, "cache longer than the model allows");
    cache_len_ = std::max(cache_len_, max_len);
    ++grows;
  }
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_positions) override {
    MG_CHECK(!slots.empty() && slots.size() == counts.size(), "forward_slots");
    int64_t longest = 0, total = 0;
    for (int64_t n : counts) {
      longest = std::max(longest, n);
      total += n;
    }
    MG_CHECK(int64_t(tokens.size()) == total, "forward_slots: ", tokens.size(), " tokens for ", total);
    const int64_t out_n = all_positions ? longest : 1, b = int64_t(slots.size());
    Tensor logits = Tensor::zeros({b, out_n, width_}, DType::F32);
    for (int64_t i = 0, t = 0; i < b; ++i) {
      auto& row = rows_.at(size_t(slots[size_t(i)]));
      const int64_t n = counts[size_t(i)];
      MG_CHECK(int64_t(row.size()) + n <= cache_len_, "forward past the cache");
      for (int64_t j = 0; j < n; ++j, ++t) {
        row.push_back(tokens[size_t(t)]);
        if (all_positions || j == n - 1)
          fn_(row, std::span<float>(logits.data<float>() + (i * out_n + (all_positions ? j : 0)) * width_, width_));
      }
    }
    forwarded_tokens += total;
    ++forwards;
    batch_sizes.push_back(b);
    return logits;
  }
  std::vector<int64_t> batch_sizes;  // rows of each forward_slots call
  int64_t grows = 0;

  int64_t forwarded_tokens = 0;
  int64_t forwards = 0;
  int64_t starts = 0;

 private:
  int64_t width_, max_len_, cache_len_ = 0;
  LogitsFn fn_;
  std::vector<std::vector<int32_t>> rows_;
};

// Logits from a table of next-token distributions keyed on the last token: probs[last] (rows of
// probabilities, any missing entries 0) -> logits = log p (or -1e9 for p = 0).
inline LogitsFn table_logits(std::vector<std::vector<double>> probs) {
  return [probs](std::span<const int32_t> prefix, std::span<float> logits) {
    const auto& p = probs.at(size_t(prefix.back()));
    for (size_t v = 0; v < logits.size(); ++v)
      logits[v] = v < p.size() && p[v] > 0 ? float(std::log(p[v])) : -1e9f;
  };
}

}  // namespace megatron::inference::testing
