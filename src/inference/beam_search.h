// Beam search for one prompt (Megatron's beam_search_and_return_on_first_stage and its
// BeamHypotheses). Each step expands every live beam over the real vocabulary, keeps the best
// 2 * beam_width candidates; a candidate ending in `stop_token` that ranks within the first
// beam_width becomes a finished hypothesis scored sum(logprobs) / generated_length^length_penalty
// (the stop token counts in the length and is not part of the returned tokens); the others
// continue. Search ends when beam_width hypotheses are finished and none of the live beams can
// beat the worst of them, or at the length limit, where the live beams are added as they are.
#pragma once

#include <cstdint>
#include <vector>

#include "inference/language_model.h"

namespace megatron::inference {

struct BeamSearchRequest {
  std::vector<int32_t> prompt;
  // Encoder-decoder models: the encoder's input, which every beam reads (empty: decoder-only).
  std::vector<int32_t> encoder_input;
  int64_t tokens_to_generate = 64;
  int beam_width = 1;
  int32_t stop_token = 50256;
  float length_penalty = 1.0f;
};

struct BeamHypothesis {
  std::vector<int32_t> tokens;  // prompt + generated (without the stop token)
  float score = 0.0f;
};

// Returns up to beam_width hypotheses, best first. `vocab` is the real vocabulary size.
std::vector<BeamHypothesis> beam_search(LanguageModel& model, const BeamSearchRequest& request,
                                        int64_t vocab);

}  // namespace megatron::inference
