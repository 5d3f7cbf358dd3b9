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

#include <cstdint>
#include <span>
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
