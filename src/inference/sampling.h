// Token sampling with Megatron's semantics (megatron/inference/text_generation/sampling.py):
//  - top_k == 1: greedy argmax (temperature ignored);
//  - otherwise logits / temperature, then top-k (keep logits >= the k-th largest) when
//    top_k > 1, else nucleus top-p when top_p > 0 (keep the smallest prefix of the sorted
//    distribution whose mass reaches top_p; the most likely token is always kept), then a
//    multinomial draw. top_k == 0 and top_p == 0 is plain temperature sampling, not greedy.
// Draws come from a counter-based stream (Philox) per sequence, so a seed reproduces a result
// whatever else shares the batch. Only the real vocabulary is sampled: logits of padded rows
// are never chosen (Megatron clamps them into range instead).
#pragma once

#include <cfloat>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"

namespace megatron::inference {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 0.0f;
  float top_p_decay = 0.0f;  // after each generated token top_p *= decay (when > 0)
  float top_p_bound = 0.0f;  // decayed top_p never drops below this (when > 0)
  bool greedy() const { return top_k == 1; }
};

// The accepted range of each setting. Megatron accepts a temperature in (0, 100]; here its lower
// end is the smallest normal single-precision number, below which the temperature itself is not
// representable in the float it is kept in (1e-40 would be a denormal, 1e-320 zero). Any accepted
// temperature samples correctly: a tiny one puts all the mass on the largest logits.
inline constexpr double kMinTemperature = double(FLT_MIN);  // 1.17549435e-38
inline constexpr double kMaxTemperature = 100.0;
inline constexpr int kMaxTopK = 1000;

// What each setting is called where it came from (request fields or command-line flags), for the
// messages of sampling_params_error.
struct SamplingNames {
  const char* temperature;
  const char* top_k;
  const char* top_p;
  const char* top_p_decay;
  const char* top_p_bound;
};
inline constexpr SamplingNames kRequestFieldNames{"temperature", "top_k", "top_p", "top_p_decay",
                                                  "top_p_bound"};
inline constexpr SamplingNames kFlagNames{"--temperature", "--top_k", "--top_p", "--top-p-decay",
                                          "--top-p-bound"};

// "" when the settings are valid; else what is wrong, naming the setting, its accepted range and
// the value given: temperature finite in [kMinTemperature, kMaxTemperature] (ignored when greedy),
// top_k in [0, kMaxTopK], top_p in [0, 1], top_p_decay and top_p_bound in [0, 1] and only with
// top_p, top_p_bound <= top_p, not both top_k > 1 and top_p.
std::string sampling_params_error(const SamplingParams& params, const SamplingNames& names);

// top_p for the next token after one generated with `current` (Megatron's decay rule).
float next_top_p(const SamplingParams& params, float current);

// A reproducible stream of uniform doubles in [0, 1) for one sequence.
class SamplingStream {
 public:
  SamplingStream(uint64_t seed, uint64_t sequence) : rng_(seed, sequence) {}
  double next();

 private:
  Philox rng_;
  uint64_t counter_ = 0;
};

// Samples an id in [0, vocab) from `logits` (at least `vocab` entries) with `top_p` as the
// current nucleus size. `u` is a uniform draw in [0, 1); `scratch` avoids reallocation.
// Probabilities are exp((logit - max) / temperature) in double precision, so no valid temperature
// overflows. Throws megatron::Error when the settings are invalid (sampling_params_error) or the
// logits are not finite (NaN or +inf: the model's weights or activations are broken).
int32_t sample_token(std::span<const float> logits, int64_t vocab, const SamplingParams& params,
                     float top_p, double u, std::vector<float>& scratch,
                     std::vector<int32_t>& index_scratch);

// Index of the largest of the first `vocab` logits (the first one on ties).
int32_t argmax(std::span<const float> logits, int64_t vocab);

// log softmax(logits)[token] over all entries of `logits` (the padded vocabulary, as Megatron
// computes log-probs from the full logits).
float token_logprob(std::span<const float> logits, int32_t token);
// log(sum(exp(logits))), computed stably.
double log_sum_exp(std::span<const float> logits);

}  // namespace megatron::inference
