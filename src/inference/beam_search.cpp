// Beam search over a LanguageModel; the cache rows follow the beams through reorder().
#include "inference/beam_search.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "inference/sampling.h"

namespace megatron::inference {
namespace {

// Megatron's BeamHypotheses: the best `capacity` finished hypotheses.
class Hypotheses {
 public:
  Hypotheses(int capacity, float length_penalty)
      : capacity_(capacity), length_penalty_(length_penalty) {}

  void add(std::vector<int32_t> tokens, double sum_logprobs, int64_t length) {
    const double score = sum_logprobs / std::pow(double(length), double(length_penalty_));
    if (int(beams_.size()) < capacity_ || score > worst_) {
      beams_.push_back({std::move(tokens), float(score)});
      if (int(beams_.size()) > capacity_) {
        auto worst = std::min_element(beams_.begin(), beams_.end(),
                                      [](auto& a, auto& b) { return a.score < b.score; });
        beams_.erase(worst);
        worst_ = std::min_element(beams_.begin(), beams_.end(), [](auto& a, auto& b) {
                   return a.score < b.score;
                 })->score;
      } else {
        worst_ = std::min(worst_, score);
      }
    }
  }

  bool is_done(double best_sum_logprobs, int64_t length) const {
    if (int(beams_.size()) < capacity_) return false;
    return worst_ >= best_sum_logprobs / std::pow(double(length), double(length_penalty_));
  }

  std::vector<BeamHypothesis> sorted() && {
    std::stable_sort(beams_.begin(), beams_.end(),
                     [](auto& a, auto& b) { return a.score > b.score; });
    return std::move(beams_);
  }

 private:
  int capacity_;
  float length_penalty_;
  double worst_ = 1e9;
  std::vector<BeamHypothesis> beams_;
};

struct Candidate {
  double score;
  int64_t beam;
  int32_t token;
};

}  // namespace

std::vector<BeamHypothesis> beam_search(LanguageModel& model, const BeamSearchRequest& request,
                                        int64_t vocab) {
  const int beam = request.beam_width;
  const int64_t prompt_len = int64_t(request.prompt.size());
  MG_REQUIRE(beam >= 1, "beam_width must be >= 1");
  MG_REQUIRE(prompt_len >= 1, "the beam search prompt is empty after tokenization");
  MG_REQUIRE(request.tokens_to_generate >= 1, "beam search needs tokens_to_generate >= 1");
  const int64_t total = prompt_len + request.tokens_to_generate;
  MG_REQUIRE(total <= model.max_sequence_length(), "prompt (", prompt_len,
             " tokens) + tokens_to_generate (", request.tokens_to_generate,
             ") exceeds the model's maximum sequence length ", model.max_sequence_length());
  const int64_t width = model.vocab_size();
  MG_CHECK(vocab > 0 && vocab <= width, "vocabulary ", vocab, " vs logits width ", width);

  if (!request.encoder_input.empty()) model.set_encoder_inputs({request.encoder_input});
  model.start(beam, total);
  std::vector<int32_t> feed;
  for (int b = 0; b < beam; ++b) feed.insert(feed.end(), request.prompt.begin(), request.prompt.end());
  Tensor logits = model.prefill(feed, prompt_len, false);

  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(beam), request.prompt);
  std::vector<double> scores(static_cast<size_t>(beam), 0.0);
  Hypotheses hyps(beam, request.length_penalty);
  std::vector<Candidate> candidates;
  bool done = false;
  int64_t generated = 0;
  for (int64_t ctx = prompt_len; ctx < total; ++ctx) {
    generated = ctx + 1 - prompt_len;
    // On the first step all beams are the same prompt: expand beam 0 only.
    const int live = ctx == prompt_len ? 1 : beam;
    candidates.clear();
    for (int b = 0; b < live; ++b) {
      std::span<const float> row(logits.data<float>() + int64_t(b) * width, size_t(width));
      const double lse = log_sum_exp(row);
      for (int64_t v = 0; v < vocab; ++v)
        candidates.push_back({double(row[v]) - lse + scores[b], b, int32_t(v)});
    }
    const size_t keep = std::min(candidates.size(), size_t(2 * beam));
    std::partial_sort(candidates.begin(), candidates.begin() + keep, candidates.end(),
                      [](const Candidate& a, const Candidate& c) {
                        if (a.score != c.score) return a.score > c.score;
                        return a.beam * 0x7fffffffLL + a.token < c.beam * 0x7fffffffLL + c.token;
                      });
    std::vector<Candidate> next;
    for (size_t rank = 0; rank < keep && int(next.size()) < beam; ++rank) {
      const auto& c = candidates[rank];
      if (c.token == request.stop_token) {
        if (rank >= size_t(beam)) continue;
        hyps.add(tokens[size_t(c.beam)], c.score, generated);
      } else {
        next.push_back(c);
      }
    }
    if (hyps.is_done(candidates[0].score, generated)) {
      done = true;
      break;
    }
    while (int(next.size()) < beam) next.push_back(next.empty() ? candidates[0] : next.back());
    std::vector<std::vector<int32_t>> new_tokens(static_cast<size_t>(beam));
    std::vector<int64_t> src(static_cast<size_t>(beam));
    std::vector<int32_t> step(static_cast<size_t>(beam));
    for (int b = 0; b < beam; ++b) {
      src[b] = next[b].beam;
      new_tokens[b] = tokens[size_t(next[b].beam)];
      new_tokens[b].push_back(next[b].token);
      scores[b] = next[b].score;
      step[b] = next[b].token;
    }
    tokens = std::move(new_tokens);
    if (ctx + 1 < total) {
      model.reorder(src);
      logits = model.decode_step(step);
    }
  }
  if (!done)
    for (int b = 0; b < beam; ++b) hyps.add(tokens[size_t(b)], scores[b], generated);
  return std::move(hyps).sorted();
}

}  // namespace megatron::inference
