// Continuous batching engine: slots, a decode forward over running sequences, a prefill forward
// over newcomers, finished sequences retired at once.
#include "inference/batch_engine.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::inference {

BatchEngine::BatchEngine(LanguageModel& model, int64_t vocab, SpecialTokens special,
                         int64_t slots)
    : model_(model), vocab_(vocab), special_(std::move(special)), slots_(slots) {
  MG_REQUIRE(slots >= 1, "the batch needs at least one slot");
  MG_REQUIRE(model.supports_slots(), "this model has no cache slots (continuous batching)");
  MG_CHECK(vocab > 0 && vocab <= model.vocab_size(), "vocabulary ", vocab, " vs logits width ",
           model.vocab_size());
  reset();
}

void BatchEngine::reset() {
  running_.clear();
  free_.clear();
  for (int64_t s = slots_ - 1; s >= 0; --s) free_.push_back(s);
  started_ = false;
  cache_len_ = 0;
}

void BatchEngine::validate(const SequenceRequest& request, int64_t index) const {
  check_encoder_input(request, index);
  SequenceDecoder(request, index, vocab_, model_.max_sequence_length());
}

void BatchEngine::check_encoder_input(const SequenceRequest& request, int64_t index) const {
  MG_REQUIRE(model_.encoder_decoder() == !request.encoder_input.empty(), "prompt ", index,
             model_.encoder_decoder() ? " has no encoder input, which this encoder-decoder model needs"
                                      : " has an encoder input, which this decoder-only model cannot read");
}

void BatchEngine::admit(SequenceRequest request, uint64_t id, int64_t index) {
  MG_CHECK(!free_.empty(), "admit with no free slot");
  check_encoder_input(request, index);
  SequenceDecoder decoder(std::move(request), index, vocab_, model_.max_sequence_length());
  const int64_t need = decoder.limit();
  if (!started_) {
    model_.start_slots(slots_, need);
    started_ = true;
    cache_len_ = need;
  } else if (need > cache_len_) {
    // Doubling keeps the copies rare; the running sequences keep their cache entries.
    const int64_t grown = std::min(model_.max_sequence_length(), std::max(need, 2 * cache_len_));
    model_.grow_slots(grown);
    cache_len_ = grown;
  }
  const int64_t slot = free_.back();
  free_.pop_back();
  model_.clear_slot(slot);
  running_.push_back(Sequence{id, slot, std::move(decoder)});
}

void BatchEngine::cancel(uint64_t id) {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const Sequence& s) { return s.id == id; });
  if (it == running_.end()) return;
  free_.push_back(it->slot);
  running_.erase(it);
  std::sort(free_.begin(), free_.end(), std::greater<int64_t>());
}

namespace {

// Runs one sequence's share of a step; an exception ends that sequence only.
template <typename Fn>
void confined(SequenceDecoder& decoder, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    decoder.fail(e.what());
  }
}

}  // namespace

std::vector<BatchEngine::Finished> BatchEngine::step() {
  const int64_t width = model_.vocab_size();
  std::vector<int64_t> slots, counts;
  std::vector<int32_t> tokens;
  std::vector<Sequence*> rows;

  // Decode: every prefilled sequence feeds the token it chose last.
  for (auto& seq : running_)
    if (seq.prefilled) {
      rows.push_back(&seq);
      slots.push_back(seq.slot);
      tokens.push_back(seq.next);
      counts.push_back(1);
    }
  if (!rows.empty()) {
    const Tensor logits = model_.forward_slots(slots, tokens, counts, false);
    for (size_t k = 0; k < rows.size(); ++k) {
      Sequence& seq = *rows[k];
      ++seq.fed;
      const float* row = logits.data<float>() + int64_t(k) * width;
      confined(seq.decoder, [&] {
        seq.next = seq.decoder.advance(std::span(row, size_t(width)), seq.fed, vocab_, special_,
                                       scratch_);
      });
    }
  }

  // Prefill: the newcomers' whole prompts in one forward; the last position picks the first token.
  rows.clear();
  slots.clear();
  counts.clear();
  tokens.clear();
  bool any_logprobs = false;
  for (auto& seq : running_)
    if (!seq.prefilled) {
      // An encoder-decoder model encodes the newcomer's input into its slot first.
      if (const auto& input = seq.decoder.request().encoder_input; !input.empty()) {
        confined(seq.decoder, [&] { model_.set_slot_encoder_input(seq.slot, input); });
        if (seq.decoder.done()) continue;
      }
      const auto& prompt = seq.decoder.request().prompt;
      rows.push_back(&seq);
      slots.push_back(seq.slot);
      tokens.insert(tokens.end(), prompt.begin(), prompt.end());
      counts.push_back(int64_t(prompt.size()));
      any_logprobs = any_logprobs || seq.decoder.request().return_logprobs;
    }
  if (!rows.empty()) {
    const Tensor logits = model_.forward_slots(slots, tokens, counts, any_logprobs);
    const int64_t positions = logits.size(1);
    for (size_t k = 0; k < rows.size(); ++k) {
      Sequence& seq = *rows[k];
      seq.fed = counts[k];
      seq.prefilled = true;
      const float* base = logits.data<float>() + int64_t(k) * positions * width;
      const float* last = base + (any_logprobs ? seq.fed - 1 : 0) * width;
      confined(seq.decoder, [&] {
        if (any_logprobs) seq.decoder.score_prompt(base, seq.fed, width, vocab_);
        seq.next = seq.decoder.advance(std::span(last, size_t(width)), seq.fed, vocab_, special_,
                                       scratch_);
      });
    }
  }

  // Retire finished sequences: their slots are free for the next admit().
  std::vector<Finished> finished;
  for (auto& seq : running_)
    if (seq.decoder.done()) {
      finished.push_back(Finished{seq.id, std::move(seq.decoder.result())});
      free_.push_back(seq.slot);
    }
  std::erase_if(running_, [](const Sequence& s) { return s.decoder.done(); });
  std::sort(free_.begin(), free_.end(), std::greater<int64_t>());
  ++steps_;
  return finished;
}

}  // namespace megatron::inference
