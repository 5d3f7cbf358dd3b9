// The sampling generation loop (Megatron's generate_tokens_probs_and_return_on_first_stage) on
// a LanguageModel with a KV cache. Each row carries its own settings, so requests with
// different sampling parameters, lengths and stop rules share one batch.
//
// Rows of different prompt lengths: a model with ragged prefill takes every whole prompt at once
// and then advances each row from its own length. Otherwise the batch is prefilled up to the
// shortest prompt and each later position is fed one token at a time, taking the prompt's own
// token for rows still inside their prompt and a sampled one for the others. Either way no row
// ever sees another row's tokens or padding. Finished rows leave the model's batch.
// Outputs follow Megatron: `tokens` is prompt + generation including the stop token that ended
// it; `logprobs` has one entry per token after the first (prompt tokens included), computed as
// log_softmax over the full (padded) logits before temperature/top-k/top-p.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "inference/language_model.h"
#include "inference/sampling.h"

namespace megatron::data {
class Tokenizer;
}

namespace megatron::inference {

// Token ids the stop rules need, taken from the tokenizer (GPT-2: eod 50256, "\n" 198,
// "\n\n" 628, ":" 25, as Megatron hard-codes them).
struct SpecialTokens {
  std::optional<int32_t> eod;
  std::optional<int32_t> newline;
  std::optional<int32_t> double_newline;
  std::optional<int32_t> colon;
  static SpecialTokens from_tokenizer(const data::Tokenizer& tokenizer);
};

enum class FinishReason { Length, Stop, Callback };
const char* finish_reason_name(FinishReason r);  // "length", "stop", "stop"

struct SequenceRequest {
  std::vector<int32_t> prompt;  // at least one token (add the BOS before)
  // Encoder-decoder models: the encoder's input of this row (the prompt is then the decoder's
  // start, T5's [BOS]); empty for decoder-only models. Used by BatchEngine.
  std::vector<int32_t> encoder_input;
  int64_t tokens_to_generate = 64;
  bool return_logprobs = false;
  int top_logprobs = 0;  // with return_logprobs: also the n most likely tokens at each position
  SamplingParams sampling;
  uint64_t seed = 0;      // with `sequence`, names the random stream of this row
  uint64_t sequence = 0;
  bool stop_on_eod = true;
  bool stop_on_eol = false;
  bool stop_on_double_eol = false;
  bool prevent_newline_after_colon = false;
  // Called after each generated token with the row's tokens so far (prompt + generation) and
  // the generated token's log-prob (NaN when not requested). Return false to end the row (a
  // stop string was produced, or the client went away): finish reason Callback.
  std::function<bool(std::span<const int32_t> tokens, float logprob)> on_token;
};

struct SequenceResult {
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t prompt_length = 0;
  std::vector<float> logprobs;  // tokens.size() - 1 entries when requested
  // Aligned with logprobs when top_logprobs > 0: (token, log-prob), most likely first.
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  FinishReason finish = FinishReason::Length;
  // Set when this sequence failed (BatchEngine confines the failure to it): what went wrong. The
  // other fields hold what was generated before.
  std::string error;
  int64_t generated() const { return int64_t(tokens.size()) - prompt_length; }
};

// The n most likely of the first `vocab` entries with their log-probs (log-softmax over all).
std::vector<std::pair<int32_t, float>> top_n_logprobs(std::span<const float> logits, int64_t vocab,
                                                     int n);

// Buffers reused across rows and steps.
struct DecodeScratch {
  std::vector<float> logits, probs;
  std::vector<int32_t> index;
};

// One sequence's generation: its random stream and nucleus size, stop rules, log-probs and
// result. generate() and BatchEngine (batch_engine.h) both drive it, so a sequence gets the same
// tokens whichever runs it and whatever shares its batch: its draws depend only on its own seed,
// sequence number and token count.
class SequenceDecoder {
 public:
  // Checks the request (throws megatron::Error naming prompt `index`).
  SequenceDecoder(SequenceRequest request, int64_t index, int64_t vocab,
                  int64_t max_sequence_length);
  const SequenceRequest& request() const { return request_; }
  int64_t limit() const { return limit_; }  // prompt + tokens_to_generate
  bool done() const { return done_; }
  // Log-probs (when requested) of prompt tokens 1..fed-1 from the logits of positions
  // 0..fed-2, which lie `width` floats apart from `logits`.
  void score_prompt(const float* logits, int64_t fed, int64_t width, int64_t vocab);
  // With the logits of position pos - 1 (pos = positions fed so far), chooses the token at pos:
  // the prompt's own while inside the prompt, else a sampled one; applies the stop rules and
  // the callback. Returns the token to feed next (the end-of-document id, or 0, once done).
  int32_t advance(std::span<const float> logits, int64_t pos, int64_t vocab,
                  const SpecialTokens& special, DecodeScratch& scratch);
  SequenceResult& result() { return result_; }
  // Ends the sequence with `why` as its error (result().error).
  void fail(std::string why);

 private:
  SequenceRequest request_;
  int64_t limit_ = 0;
  bool done_ = false;
  float top_p_ = 0.0f;
  std::optional<SamplingStream> stream_;
  SequenceResult result_;
};

// Runs the batch to completion. `vocab` is the real vocabulary size (ids >= vocab, the padding
// rows of the logits, are never sampled). Throws megatron::Error if a row does not fit the
// model's maximum sequence length.
std::vector<SequenceResult> generate(LanguageModel& model, std::span<SequenceRequest> rows,
                                     int64_t vocab, const SpecialTokens& special);

}  // namespace megatron::inference
