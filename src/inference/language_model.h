// The interface generation runs on: a causal language model decoded incrementally with a
// key/value cache. The generation loop (generation.h, beam_search.h) only ever calls this
// interface, so the GPT engine (gpt_inference.h) and test doubles are interchangeable.
//
// Contract: `start` sizes the cache for `batch` rows of up to `max_len` positions and forgets
// everything. `forward` then appends `n` tokens per row at positions [pos, pos + n), where `pos`
// is the number of positions already fed (the same for every row: shorter prompts are extended
// one token at a time by the caller, so no row ever attends to padding). It returns fp32 logits
// [batch, n, vocab_size()] when `all_positions`, else [batch, 1, vocab_size()] for the last
// position. `reorder` makes row i of the cache a copy of old row src[i], for i < src.size();
// the batch becomes src.size() rows (beam search reorders; generation drops finished rows).
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace megatron::inference {

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  // Width of the logits (the padded vocabulary).
  virtual int64_t vocab_size() const = 0;
  // Longest sequence (prompt + generation) the model accepts (max_position_embeddings).
  virtual int64_t max_sequence_length() const = 0;
  virtual void start(int64_t batch, int64_t max_len) = 0;
  // tokens: `batch * n` ids, row-major [batch, n].
  virtual Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) = 0;
  virtual void reorder(std::span<const int64_t> src) = 0;
  // Positions fed since `start`.
  virtual int64_t position() const = 0;

  // Convenience names for the two phases.
  Tensor prefill(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
    return forward(tokens, n, all_positions);
  }
  Tensor decode_step(std::span<const int32_t> next_tokens) { return forward(next_tokens, 1, false); }
};

}  // namespace megatron::inference
