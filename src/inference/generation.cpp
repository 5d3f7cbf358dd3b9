// The sampling generation loop: prefill to the shortest prompt, then one position per step.
#include "inference/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "data/tokenizer.h"

namespace megatron::inference {
namespace {

std::optional<int32_t> single_token(const data::Tokenizer& tokenizer, std::string_view text) {
  try {
    const auto ids = tokenizer.encode(text);
    if (ids.size() == 1) return ids[0];
  } catch (const Error&) {
    // Tokenizers that cannot encode this text (NullTokenizer) simply have no such token.
  }
  return std::nullopt;
}

}  // namespace

SpecialTokens SpecialTokens::from_tokenizer(const data::Tokenizer& tokenizer) {
  SpecialTokens s;
  s.eod = tokenizer.eod();
  s.newline = single_token(tokenizer, "\n");
  s.double_newline = single_token(tokenizer, "\n\n");
  s.colon = single_token(tokenizer, ":");
  return s;
}

std::vector<std::pair<int32_t, float>> top_n_logprobs(std::span<const float> logits, int64_t vocab,
                                                     int n) {
  n = int(std::min<int64_t>(n, vocab));
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) idx[size_t(i)] = int32_t(i);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double lse = log_sum_exp(logits);
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) out.push_back({idx[size_t(i)], float(double(logits[idx[size_t(i)]]) - lse)});
  return out;
}

const char* finish_reason_name(FinishReason r) {
  return r == FinishReason::Length ? "length" : "stop";
}

SequenceDecoder::SequenceDecoder(SequenceRequest request, int64_t index, int64_t vocab,
                                 int64_t max_sequence_length)
    : request_(std::move(request)) {
  const auto& r = request_;
  MG_REQUIRE(!r.prompt.empty(), "prompt ", index, " is empty after tokenization (set add_BOS)");
  MG_REQUIRE(r.tokens_to_generate >= 0, "tokens_to_generate must be >= 0");
  for (int32_t t : r.prompt)
    MG_REQUIRE(t >= 0 && t < vocab, "prompt ", index, " has token id ", t,
               " outside the vocabulary [0, ", vocab, ")");
  if (const std::string e = sampling_params_error(r.sampling, kRequestFieldNames); !e.empty())
    MG_THROW("prompt ", index, ": invalid sampling settings: ", e);
  limit_ = int64_t(r.prompt.size()) + r.tokens_to_generate;
  MG_REQUIRE(limit_ <= max_sequence_length, "prompt ", index, " (", r.prompt.size(),
             " tokens) + tokens_to_generate (", r.tokens_to_generate,
             ") exceeds the model's maximum sequence length ", max_sequence_length);
  top_p_ = r.sampling.top_p;
  if (!r.sampling.greedy()) stream_.emplace(r.seed, r.sequence);
  result_.tokens = r.prompt;
  result_.prompt_length = int64_t(r.prompt.size());
  if (r.return_logprobs) result_.logprobs.reserve(size_t(limit_));
}

void SequenceDecoder::fail(std::string why) {
  done_ = true;
  result_.error = why.empty() ? "unknown error" : std::move(why);
}

void SequenceDecoder::score_prompt(const float* logits, int64_t fed, int64_t width, int64_t vocab) {
  if (!request_.return_logprobs) return;
  for (int64_t p = 0; p + 1 < fed; ++p) {
    std::span<const float> row(logits + p * width, size_t(width));
    result_.logprobs.push_back(token_logprob(row, request_.prompt[size_t(p + 1)]));
    if (request_.top_logprobs > 0)
      result_.top_logprobs.push_back(top_n_logprobs(row, vocab, request_.top_logprobs));
  }
}

int32_t SequenceDecoder::advance(std::span<const float> logits, int64_t pos, int64_t vocab,
                                 const SpecialTokens& special, DecodeScratch& scratch) {
  const int32_t filler = special.eod.value_or(0);
  if (done_) return filler;
  if (pos >= limit_) {
    done_ = true;
    return filler;
  }
  const auto& r = request_;
  auto& res = result_;
  auto& row_logits = scratch.logits;
  row_logits.assign(logits.begin(), logits.end());
  const int32_t prev = res.tokens[size_t(pos - 1)];
  if (r.prevent_newline_after_colon && special.colon && special.newline && prev == *special.colon)
    row_logits[size_t(*special.newline)] = -1e10f;
  const bool in_prompt = pos < int64_t(r.prompt.size());
  int32_t token;
  if (in_prompt) {
    token = r.prompt[size_t(pos)];
  } else {
    const double u = stream_ ? stream_->next() : 0.0;
    token = sample_token(row_logits, vocab, r.sampling, top_p_, u, scratch.probs, scratch.index);
    top_p_ = next_top_p(r.sampling, top_p_);
    res.tokens.push_back(token);
  }
  float lp = std::numeric_limits<float>::quiet_NaN();
  if (r.return_logprobs) {
    lp = token_logprob(row_logits, token);
    res.logprobs.push_back(lp);
    if (r.top_logprobs > 0) res.top_logprobs.push_back(top_n_logprobs(row_logits, vocab, r.top_logprobs));
  }
  if (!in_prompt) {
    bool stop = r.stop_on_eod && special.eod && token == *special.eod;
    if (r.stop_on_eol && ((special.newline && token == *special.newline) ||
                          (special.double_newline && token == *special.double_newline)))
      stop = true;
    if (r.stop_on_double_eol) {
      if (special.double_newline && token == *special.double_newline) stop = true;
      if (special.newline && token == *special.newline && prev == *special.newline) stop = true;
    }
    if (stop) {
      done_ = true;
      res.finish = FinishReason::Stop;
    } else if (r.on_token && !r.on_token(res.tokens, lp)) {
      done_ = true;
      res.finish = FinishReason::Callback;
    } else if (pos + 1 >= limit_) {
      done_ = true;
    }
    if (stop && r.on_token) r.on_token(res.tokens, lp);
  } else if (pos + 1 >= limit_) {
    done_ = true;
  }
  return token;
}

std::vector<SequenceResult> generate(LanguageModel& model, std::span<SequenceRequest> rows,
                                     int64_t vocab, const SpecialTokens& special) {
  const int64_t batch = int64_t(rows.size());
  std::vector<SequenceResult> results(rows.size());
  if (batch == 0) return results;
  const int64_t width = model.vocab_size();
  MG_CHECK(vocab > 0 && vocab <= width, "vocabulary ", vocab, " vs logits width ", width);

  std::vector<SequenceDecoder> seqs;
  seqs.reserve(rows.size());
  int64_t min_len = std::numeric_limits<int64_t>::max(), max_total = 0;
  bool any_logprobs = false;
  for (int64_t i = 0; i < batch; ++i) {
    seqs.emplace_back(rows[i], i, vocab, model.max_sequence_length());
    min_len = std::min<int64_t>(min_len, int64_t(rows[i].prompt.size()));
    max_total = std::max(max_total, seqs.back().limit());
    any_logprobs = any_logprobs || rows[i].return_logprobs;
  }

  model.start(batch, max_total);
  // Prefill: every whole prompt when the model can (ragged), else up to the shortest prompt.
  const bool ragged = model.supports_ragged();
  std::vector<int64_t> fed(static_cast<size_t>(batch));  // positions fed per row
  Tensor logits;
  if (ragged) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < batch; ++i) {
      prompts.push_back(rows[i].prompt);
      fed[size_t(i)] = int64_t(rows[i].prompt.size());
    }
    logits = model.prefill_ragged(prompts, any_logprobs);
  } else {
    std::vector<int32_t> feed(static_cast<size_t>(batch * min_len));
    for (int64_t i = 0; i < batch; ++i) {
      std::copy_n(rows[i].prompt.begin(), min_len, feed.begin() + i * min_len);
      fed[size_t(i)] = min_len;
    }
    logits = model.prefill(feed, min_len, any_logprobs);
  }
  int64_t positions_in_logits = logits.size(1);
  // Log-probs of the prompt tokens the prefill covered come from its earlier positions.
  std::vector<int64_t> last_offset(static_cast<size_t>(batch), 0);  // row's last position in logits
  if (any_logprobs) {
    for (int64_t i = 0; i < batch; ++i) {
      last_offset[size_t(i)] = fed[size_t(i)] - 1;
      seqs[size_t(i)].score_prompt(logits.data<float>() + i * positions_in_logits * width,
                                   fed[size_t(i)], width, vocab);
    }
  }

  DecodeScratch scratch;
  std::vector<int32_t> next(static_cast<size_t>(batch));
  // Model row m holds request row active[m]; finished rows leave the batch (see below).
  std::vector<int64_t> active(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) active[size_t(i)] = i;
  for (;;) {
    // For each row, the logits at position pos - 1 choose (or score) the token at position pos.
    bool all_done = true;
    for (int64_t m = 0; m < int64_t(active.size()); ++m) {
      const int64_t i = active[size_t(m)];
      const float* src =
          logits.data<float>() + (m * positions_in_logits + last_offset[size_t(m)]) * width;
      auto& seq = seqs[size_t(i)];
      next[size_t(m)] = seq.advance(std::span(src, size_t(width)), fed[size_t(i)], vocab, special,
                                    scratch);
      if (!seq.done()) all_done = false;
    }
    if (all_done) break;
    // Drop finished rows from the model's batch so later steps compute only live rows.
    std::vector<int64_t> keep;
    for (int64_t m = 0; m < int64_t(active.size()); ++m)
      if (!seqs[size_t(active[size_t(m)])].done()) keep.push_back(m);
    if (keep.size() < active.size()) {
      model.reorder(keep);
      std::vector<int64_t> live;
      std::vector<int32_t> live_next;
      for (int64_t m : keep) {
        live.push_back(active[size_t(m)]);
        live_next.push_back(next[size_t(m)]);
      }
      active.swap(live);
      next.swap(live_next);
    }
    logits = model.decode_step(next);
    for (int64_t i : active) ++fed[size_t(i)];
    std::fill(last_offset.begin(), last_offset.end(), 0);
    positions_in_logits = 1;
  }
  for (int64_t i = 0; i < batch; ++i) results[size_t(i)] = std::move(seqs[size_t(i)].result());
  return results;
}

}  // namespace megatron::inference
