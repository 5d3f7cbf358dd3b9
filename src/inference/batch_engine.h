// Continuous batching: sequences join and leave a running batch. Each admitted sequence holds a
// KV-cache slot of the model (LanguageModel's slot interface) and its own SequenceDecoder
// (sampling settings, random stream, stop rules, log-probs). step() decodes one token for every
// running sequence (one batched forward, each slot at its own position) and prefills the
// sequences admitted since the last step (one forward over their whole prompts, which also
// yields their first token). A finished sequence frees its slot at once, so a waiting one can be
// admitted before the next step instead of waiting for the whole batch.
//
// Results equal running each sequence alone with generate(): a slot attends only to its own
// cache, and a sequence's random draws depend only on its seed, sequence number and position
// (logits may differ in the last bits, as the matrix products see different batch sizes).
// Capacity: the number of slots bounds the batch; every slot has room for the longest sequence
// (prompt + tokens_to_generate) admitted since the cache was started, so the cache takes
// slots x that length positions. It is allocated at the first admit() and grown (doubling, at
// most to the model's context) when a longer sequence arrives; reset() gives it up.
#pragma once

#include <cstdint>
#include <vector>

#include "inference/generation.h"
#include "inference/language_model.h"

namespace megatron::inference {

class BatchEngine {
 public:
  // `vocab` is the real vocabulary size; at most `slots` sequences run at once.
  BatchEngine(LanguageModel& model, int64_t vocab, SpecialTokens special, int64_t slots);

  int64_t slots() const { return slots_; }
  int64_t free_slots() const { return int64_t(free_.size()); }
  int64_t running() const { return int64_t(running_.size()); }  // admitted, not finished
  bool idle() const { return running_.empty(); }
  int64_t steps() const { return steps_; }
  int64_t cache_length() const { return cache_len_; }  // positions per slot (0 before start)

  // Checks a request as admit() would, without admitting it (throws megatron::Error naming
  // prompt `index`).
  void validate(const SequenceRequest& request, int64_t index) const;
  // Puts a sequence into a free slot (free_slots() > 0); it is prefilled at the next step().
  // `id` names it among step()'s results. Throws megatron::Error for an invalid request.
  void admit(SequenceRequest request, uint64_t id, int64_t index = 0);

  struct Finished {
    uint64_t id = 0;
    SequenceResult result;
  };
  // One decode forward over the running sequences and one prefill forward over the newcomers
  // (either is skipped when empty). Returns the sequences that finished in this step. A failure
  // of one sequence (its sampling settings, its logits, its callback) ends that sequence alone:
  // it is returned with result.error set and the others go on. After an exception (a failed
  // forward, which concerns the whole batch) the engine's state is undefined: call reset().
  std::vector<Finished> step();

  // Drops the running sequence `id` (if any) and frees its slot; it is not returned by step().
  void cancel(uint64_t id);

  // Drops every sequence. The model's cache is started again at the next admit(), so the model
  // may be used otherwise in between (beam search runs this way).
  void reset();

 private:
  struct Sequence {
    uint64_t id = 0;
    int64_t slot = 0;
    SequenceDecoder decoder;
    int64_t fed = 0;          // positions in the slot's cache
    int32_t next = 0;         // token the next decode feeds
    bool prefilled = false;
  };

  // An encoder-decoder model's requests have an encoder input; a decoder-only model's have none.
  void check_encoder_input(const SequenceRequest& request, int64_t index) const;

  LanguageModel& model_;
  int64_t vocab_;
  SpecialTokens special_;
  int64_t slots_;
  bool started_ = false;
  int64_t cache_len_ = 0;
  std::vector<int64_t> free_;       // free slots, the lowest last
  std::vector<Sequence> running_;   // in admission order
  DecodeScratch scratch_;
  int64_t steps_ = 0;
};

}  // namespace megatron::inference
