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
//
// Optional slot interface (continuous batching, batch_engine.h): `start_slots` sizes the cache
// for `slots` independent sequences of up to `max_len` positions, all empty. `forward_slots`
// appends counts[i] tokens to slot slots[i] at that slot's own positions, so sequences at
// different positions (a newcomer's prompt, others mid-generation) share one forward. A slot is
// emptied by `clear_slot` and reused for another sequence; the others are untouched.
// `grow_slots` lengthens every slot to `max_len` positions keeping their contents, so the cache
// can start at the length the first sequences need. start() ends slot mode (beam search and
// generate() use the lockstep interface above).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
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
  // Positions fed since `start` (row 0).
  virtual int64_t position() const = 0;

  // Optional ragged prefill: row i takes all of prompts[i] at positions [0, len_i); afterwards
  // each row advances from its own length (forward with n = 1 appends at each row's position).
  // Logits [batch, max len, V] (row i's positions at [i, 0..len_i)) when all_positions, else
  // [batch, 1, V] for each row's last prompt position. Saves the one-token-at-a-time steps
  // that lockstep prefill needs for prompts longer than the shortest.
  virtual bool supports_ragged() const { return false; }
  virtual Tensor prefill_ragged(std::span<const std::vector<int32_t>> prompts, bool all_positions);

  virtual bool supports_slots() const { return false; }
  virtual void start_slots(int64_t slots, int64_t max_len);
  virtual void clear_slot(int64_t slot);
  virtual void grow_slots(int64_t max_len);
  // tokens: the slots' tokens back to back (sum of counts). Logits [k, max count, V] (slot i's
  // positions at [i, 0..counts[i])) when all_positions, else [k, 1, V] for each slot's last token.
  virtual Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                               std::span<const int64_t> counts, bool all_positions);

  // Encoder-decoder models (T5): the decoder is the language model above, and the encoder reads
  // an input of its own per sequence. set_encoder_inputs gives the rows of the next start() their
  // inputs (one per row, or one that every row reads); set_slot_encoder_input gives a slot its
  // input before the slot's first forward_slots (clear_slot forgets it). Decoder-only models
  // refuse both.
  virtual bool encoder_decoder() const { return false; }
  virtual void set_encoder_inputs(std::vector<std::vector<int32_t>> inputs);
  virtual void set_slot_encoder_input(int64_t slot, std::span<const int32_t> input);

  // Convenience names for the two phases.
  Tensor prefill(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
    return forward(tokens, n, all_positions);
  }
  Tensor decode_step(std::span<const int32_t> next_tokens) { return forward(next_tokens, 1, false); }
};

inline Tensor LanguageModel::prefill_ragged(std::span<const std::vector<int32_t>>, bool) {
  MG_CHECK(false, "this model has no ragged prefill");
  return Tensor();
}

inline void LanguageModel::set_encoder_inputs(std::vector<std::vector<int32_t>>) {
  MG_REQUIRE(false, "an encoder input was given to a decoder-only model");
}
inline void LanguageModel::set_slot_encoder_input(int64_t, std::span<const int32_t>) {
  MG_REQUIRE(false, "an encoder input was given to a decoder-only model");
}

inline void LanguageModel::start_slots(int64_t, int64_t) {
  MG_CHECK(false, "this model has no cache slots");
}
inline void LanguageModel::clear_slot(int64_t) { MG_CHECK(false, "this model has no cache slots"); }
inline void LanguageModel::grow_slots(int64_t) { MG_CHECK(false, "this model has no cache slots"); }
inline Tensor LanguageModel::forward_slots(std::span<const int64_t>, std::span<const int32_t>,
                                           std::span<const int64_t>, bool) {
  MG_CHECK(false, "this model has no cache slots");
  return Tensor();
}

}  // namespace megatron::inference
