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

namespace {

// The largest of the first `vocab` logits; throws when one is NaN or +inf, or all are -inf.
double max_finite_logit(std::span<const float> logits, int64_t vocab) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = logits[size_t(i)];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity())
      MG_THROW("the model's logits are not finite (", v, " for token ", i, "): its weights or "
               "activations overflowed; check the checkpoint's weights or run in a wider "
               "precision");
    mx = std::max(mx, v);
  }
  MG_REQUIRE(std::isfinite(mx), "every logit is -inf: no token can be sampled");
  return double(mx);
}

}  // namespace

std::string sampling_params_error(const SamplingParams& p, const SamplingNames& n) {
  const auto out_of = [](const char* name, double v, double lo, double hi) -> std::string {
    if (std::isfinite(v) && v >= lo && v <= hi) return "";
    return str(name, " must be a number in [", lo, ", ", hi, "], got ", v);
  };
  if (p.top_k < 0 || p.top_k > kMaxTopK)
    return str(n.top_k, " must be an integer in [0, ", kMaxTopK, "], got ", p.top_k);
  if (std::string e = out_of(n.temperature, p.temperature, kMinTemperature, kMaxTemperature);
      !e.empty())
    return e + (p.temperature > 0.0f && p.temperature < kMinTemperature
                    ? " (the lower limit is the smallest normal single-precision number; for "
                      "greedy decoding use top_k=1)"
                    : "");
  for (auto [name, v] : {std::pair{n.top_p, p.top_p}, std::pair{n.top_p_decay, p.top_p_decay},
                         std::pair{n.top_p_bound, p.top_p_bound}})
    if (std::string e = out_of(name, v, 0.0, 1.0); !e.empty()) return e;
  if (p.top_k > 1 && p.top_p > 0.0f)
    return str("cannot set both ", n.top_k, " (", p.top_k, ") and ", n.top_p, " (", p.top_p,
               "); use one of them");
  if (p.top_p == 0.0f && (p.top_p_decay > 0.0f || p.top_p_bound > 0.0f))
    return str(p.top_p_decay > 0.0f ? n.top_p_decay : n.top_p_bound, " needs ", n.top_p);
  if (p.top_p_bound > p.top_p)
    return str(n.top_p_bound, " (", p.top_p_bound, ") must not exceed ", n.top_p, " (", p.top_p,
               ")");
  return "";
}

int32_t sample_token(std::span<const float> logits, int64_t vocab, const SamplingParams& params,
                     float top_p, double u, std::vector<float>& probs,
                     std::vector<int32_t>& order) {
  MG_CHECK(vocab > 0 && int64_t(logits.size()) >= vocab, "sample over ", vocab, " of ",
           logits.size());
  if (const std::string e = sampling_params_error(params, kRequestFieldNames); !e.empty())
    MG_THROW("invalid sampling settings: ", e);
  const double mx = max_finite_logit(logits, vocab);
  if (params.greedy()) return argmax(logits, vocab);

  // Top-k keeps the logits >= the k-th largest (Megatron sets the others to -inf before the
  // softmax; the order of logits / temperature is that of the logits).
  float threshold = -std::numeric_limits<float>::infinity();
  if (params.top_k > 1 && params.top_k < vocab) {
    std::vector<float> kth(logits.begin(), logits.begin() + vocab);
    std::nth_element(kth.begin(), kth.begin() + (params.top_k - 1), kth.end(),
                     std::greater<float>());
    threshold = kth[size_t(params.top_k - 1)];
  }
  // softmax(logits / temperature) unnormalised, as exp((logit - max) / temperature): in double,
  // so that no temperature overflows (the largest logit gets 1, removed entries 0).
  const double t = double(params.temperature);
  probs.resize(size_t(vocab));
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[size_t(i)];
    probs[size_t(i)] = l < threshold ? 0.0f : float(std::exp((double(l) - mx) / t));
    total += probs[size_t(i)];
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
