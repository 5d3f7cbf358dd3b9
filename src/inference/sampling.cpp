// Sampling: Megatron's greedy / temperature / top-k / top-p rules over one row of logits.
#include "inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace megatron::inference {

float next_top_p(const SamplingParams& params, float current) {
  if (current > 0.0f && params.top_p_decay > 0.0f) {
    current *= params.top_p_decay;
    if (params.top_p_bound > 0.0f) current = std::max(current, params.top_p_bound);
  }
  return current;
}

double SamplingStream::next() {
  // 53 random bits from two 32-bit words of the stream.
  const uint64_t hi = rng_.u32(counter_++) >> 5;  // 27 bits
  const uint64_t lo = rng_.u32(counter_++) >> 6;  // 26 bits
  return double((hi << 26) | lo) * (1.0 / 9007199254740992.0);
}

int32_t argmax(std::span<const float> logits, int64_t vocab) {
  MG_CHECK(vocab > 0 && int64_t(logits.size()) >= vocab, "argmax over ", vocab, " of ",
           logits.size());
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

double log_sum_exp(std::span<const float> logits) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : logits) mx = std::max(mx, v);
  if (!std::isfinite(mx)) return mx;
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - double(mx));
  return double(mx) + std::log(sum);
}

float token_logprob(std::span<const float> logits, int32_t token) {
  MG_CHECK(token >= 0 && size_t(token) < logits.size(), "token ", token, " outside logits of ",
           logits.size());
  return float(double(logits[token]) - log_sum_exp(logits));
}

int32_t sample_token(std::span<const float> logits, int64_t vocab, const SamplingParams& params,
                     float top_p, double u, std::vector<float>& probs,
                     std::vector<int32_t>& order) {
  MG_CHECK(vocab > 0 && int64_t(logits.size()) >= vocab, "sample over ", vocab, " of ",
           logits.size());
  if (params.greedy()) return argmax(logits, vocab);
  MG_CHECK(params.temperature > 0.0f, "temperature must be positive");
  const float inv_t = 1.0f / params.temperature;
  probs.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) probs[i] = logits[i] * inv_t;

  // Filters mark removed entries with -inf (Megatron sets them to -inf before the softmax).
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (params.top_k > 1 && params.top_k < vocab) {
    std::vector<float> kth(probs.begin(), probs.end());
    std::nth_element(kth.begin(), kth.begin() + (params.top_k - 1), kth.end(),
                     std::greater<float>());
    const float threshold = kth[size_t(params.top_k - 1)];
    for (auto& v : probs)
      if (v < threshold) v = neg_inf;
  }
  float mx = neg_inf;
  for (float v : probs) mx = std::max(mx, v);
  MG_CHECK(std::isfinite(mx), "logits are not finite");
  double total = 0.0;
  for (auto& v : probs) {
    v = std::exp(v - mx);  // exp(-inf) = 0 for removed entries
    total += v;
  }
  if (params.top_k <= 1 && top_p > 0.0f && top_p < 1.0f) {
    // Nucleus: sort descending; drop a token when the mass of the tokens before it already
    // exceeds top_p (Megatron's shifted cumulative-sum rule keeps the first token always).
    order.resize(size_t(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
    double cumulative = 0.0;
    double kept = 0.0;
    for (size_t r = 0; r < order.size(); ++r) {
      const float p = probs[order[r]];
      if (r > 0 && cumulative / total > double(top_p)) {
        probs[order[r]] = 0.0f;
      } else {
        kept += p;
      }
      cumulative += p;
    }
    total = kept;
  }
  // Inverse CDF in index order.
  const double target = u * total;
  double acc = 0.0;
  int64_t last_nonzero = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last_nonzero = i;
    if (acc > target) return int32_t(i);
  }
  return int32_t(last_nonzero);  // rounding at u close to 1
}

}  // namespace megatron::inference
