// The generation loop on test-double models: stop rules, log-probs, scoring mode, batching of
// prompts of different lengths, seeds, callbacks, and beam search on known distributions.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "fake_model.h"
#include "inference/beam_search.h"
#include "inference/generation.h"

namespace megatron::inference {
namespace {

using testing::FakeModel;

// Next token = last + 1 (mod vocab), with certainty.
void counting(std::span<const int32_t> prefix, std::span<float> logits) {
  for (auto& v : logits) v = 0.0f;
  logits[size_t((prefix.back() + 1) % 10)] = 10.0f;
}

SequenceRequest greedy_row(std::vector<int32_t> prompt, int64_t n) {
  SequenceRequest r;
  r.prompt = std::move(prompt);
  r.tokens_to_generate = n;
  r.sampling.top_k = 1;
  return r;
}

TEST(Generation, GreedyFollowsTheModelAndStopsAtEod) {
  FakeModel model(16, 64, counting);
  SpecialTokens special;
  special.eod = 7;
  std::vector<SequenceRequest> rows = {greedy_row({1, 2}, 10), greedy_row({8}, 3)};
  auto out = generate(model, rows, 10, special);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(out[0].finish, FinishReason::Stop);
  EXPECT_EQ(out[1].tokens, (std::vector<int32_t>{8, 9, 0, 1}));
  EXPECT_EQ(out[1].finish, FinishReason::Length);
  EXPECT_EQ(out[1].generated(), 3);
  // Row 1 leaves the batch once done: prefill 2, then 2 + 2 + 1 + 1 + 1 (not 2 per step).
  EXPECT_EQ(model.forwarded_tokens, 9);
}

TEST(Generation, EolRulesAndNewlineAfterColon) {
  // Tokens: 1 = "\n", 2 = "\n\n", 3 = ":". The model always prefers "\n".
  auto prefers_newline = [](std::span<const int32_t>, std::span<float> l) {
    for (size_t v = 0; v < l.size(); ++v) l[v] = -float(v);
    l[1] = 5.0f;
  };
  FakeModel model(8, 64, prefers_newline);
  SpecialTokens special;
  special.newline = 1;
  special.double_newline = 2;
  special.colon = 3;
  auto r = greedy_row({5}, 6);
  r.stop_on_eol = true;
  std::vector<SequenceRequest> rows = {r};
  EXPECT_EQ(generate(model, rows, 8, special)[0].tokens, (std::vector<int32_t>{5, 1}));
  rows[0].stop_on_eol = false;
  rows[0].stop_on_double_eol = true;
  EXPECT_EQ(generate(model, rows, 8, special)[0].tokens, (std::vector<int32_t>{5, 1, 1}));
  rows[0].stop_on_double_eol = false;
  rows[0].prompt = {3};
  rows[0].tokens_to_generate = 2;
  rows[0].prevent_newline_after_colon = true;
  // After ":" the newline is banned, so the next best (token 0) is chosen.
  EXPECT_EQ(generate(model, rows, 8, special)[0].tokens, (std::vector<int32_t>{3, 0, 1}));
}

TEST(Generation, LogprobsCoverPromptAndGeneration) {
  FakeModel model(12, 64);
  std::vector<SequenceRequest> rows = {greedy_row({1, 2, 3}, 4), greedy_row({4, 5, 6, 7, 8}, 2)};
  for (auto& r : rows) r.return_logprobs = true;
  rows[1].sampling = SamplingParams{};  // sampled row beside a greedy one
  rows[1].seed = 99;
  auto out = generate(model, rows, 10, SpecialTokens{});
  for (const auto& res : out) {
    ASSERT_EQ(res.logprobs.size(), res.tokens.size() - 1);
    std::vector<float> logits(12);
    for (size_t j = 1; j < res.tokens.size(); ++j) {
      testing::hashed_logits(std::span(res.tokens).first(j), logits);
      EXPECT_NEAR(res.logprobs[j - 1], token_logprob(logits, res.tokens[j]), 1e-6) << j;
    }
  }
}

TEST(Generation, ScoringModeGeneratesNothing) {
  FakeModel model(12, 64);
  std::vector<SequenceRequest> rows = {greedy_row({1, 2, 3}, 0), greedy_row({4, 5}, 0)};
  for (auto& r : rows) r.return_logprobs = true;
  auto out = generate(model, rows, 12, SpecialTokens{});
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(out[0].logprobs.size(), 2u);
  EXPECT_EQ(out[1].logprobs.size(), 1u);
}

TEST(Generation, BatchedRowsEqualRowsAlone) {
  std::vector<SequenceRequest> rows;
  for (int i = 0; i < 4; ++i) {
    SequenceRequest r;
    for (int j = 0; j <= 2 * i; ++j) r.prompt.push_back((i * 7 + j) % 20);
    r.tokens_to_generate = 5 + i;
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.seed = 42;
    r.sequence = uint64_t(i);
    r.return_logprobs = true;
    rows.push_back(r);
  }
  FakeModel model(24, 64), ragged(24, 64);
  ragged.ragged = true;
  SpecialTokens special;
  special.eod = 19;
  const auto batched = generate(model, rows, 20, special);
  // Ragged prefill (whole prompts at once) gives the same results with fewer model calls.
  const auto batched_ragged = generate(ragged, rows, 20, special);
  EXPECT_LT(ragged.forwards, model.forwards);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(batched_ragged[i].tokens, batched[i].tokens) << i;
    EXPECT_EQ(batched_ragged[i].logprobs, batched[i].logprobs) << i;
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    FakeModel alone(24, 64);
    std::vector<SequenceRequest> one = {rows[i]};
    const auto single = generate(alone, one, 20, special);
    EXPECT_EQ(single[0].tokens, batched[i].tokens) << i;
    EXPECT_EQ(single[0].logprobs, batched[i].logprobs) << i;
  }
  // The same seed reproduces; another seed changes the sample.
  FakeModel again(24, 64);
  EXPECT_EQ(generate(again, rows, 20, special)[3].tokens, batched[3].tokens);
  rows[3].seed = 43;
  FakeModel other(24, 64);
  EXPECT_NE(generate(other, rows, 20, special)[3].tokens, batched[3].tokens);
}

TEST(Generation, CallbackEndsARowAndSeesEveryToken) {
  FakeModel model(16, 64, counting);
  auto r = greedy_row({0}, 8);
  std::vector<int32_t> seen;
  r.on_token = [&](std::span<const int32_t> tokens, float) {
    seen.push_back(tokens.back());
    return tokens.back() != 3;
  };
  std::vector<SequenceRequest> rows = {r};
  auto out = generate(model, rows, 10, SpecialTokens{});
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(out[0].finish, FinishReason::Callback);
  EXPECT_EQ(seen, (std::vector<int32_t>{1, 2, 3}));
}

TEST(Generation, RejectsRowsThatDoNotFit) {
  FakeModel model(16, 8, counting);
  std::vector<SequenceRequest> rows = {greedy_row({1, 2, 3}, 6)};
  EXPECT_THROW(generate(model, rows, 10, SpecialTokens{}), Error);
  rows[0] = greedy_row({}, 2);
  EXPECT_THROW(generate(model, rows, 10, SpecialTokens{}), Error);
  rows[0] = greedy_row({12}, 2);
  EXPECT_THROW(generate(model, rows, 10, SpecialTokens{}), Error);
}

// Vocabulary: 0 = prompt, 1 = A, 2 = B, 3 = C, 4 = stop.
TEST(BeamSearch, FindsTheBestSequenceGreedyMisses) {
  FakeModel model(8, 32, testing::table_logits({
                             {0.0, 0.5, 0.4, 0.1},  // after the prompt
                             {0.0, 0.25, 0.25, 0.25, 0.25},  // after A: flat
                             {0.0, 0.05, 0.05, 0.9},  // after B: C
                             {0.0, 0.4, 0.3, 0.3},  // after C
                         }));
  BeamSearchRequest req;
  req.prompt = {0};
  req.tokens_to_generate = 2;
  req.beam_width = 2;
  req.stop_token = 4;
  req.length_penalty = 1.0f;
  auto hyps = beam_search(model, req, 5);
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].tokens, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_NEAR(hyps[0].score, std::log(0.4 * 0.9) / 2.0, 1e-5);
  EXPECT_GE(hyps[0].score, hyps[1].score);
}

TEST(BeamSearch, StopTokenFinishesAHypothesis) {
  FakeModel model(8, 32, testing::table_logits({
                             {0.0, 0.6, 0.4},  // after the prompt: A or B
                             {0.0, 0.0, 0.0, 0.0, 1.0},  // after A: stop
                             {0.0, 0.0, 0.0, 0.4, 0.6},  // after B: C or stop
                             {0.0, 0.0, 0.0, 0.0, 1.0},  // after C: stop
                         }));
  BeamSearchRequest req;
  req.prompt = {0};
  req.tokens_to_generate = 5;
  req.beam_width = 2;
  req.stop_token = 4;
  req.length_penalty = 0.0f;  // raw sum of log-probs
  auto hyps = beam_search(model, req, 5);
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].tokens, (std::vector<int32_t>{0, 1}));  // A, stop: p = 0.6
  EXPECT_NEAR(hyps[0].score, std::log(0.6), 1e-5);
  EXPECT_EQ(hyps[1].tokens, (std::vector<int32_t>{0, 2}));  // B, stop: p = 0.24
  EXPECT_NEAR(hyps[1].score, std::log(0.24), 1e-5);  // beats B, C, stop (0.16)
}

TEST(BeamSearch, WidthOneIsGreedy) {
  FakeModel a(12, 64), b(12, 64);
  BeamSearchRequest req;
  req.prompt = {3, 1};
  req.tokens_to_generate = 6;
  req.beam_width = 1;
  req.stop_token = 11;  // never reachable: vocab 10
  auto hyps = beam_search(a, req, 10);
  std::vector<SequenceRequest> rows = {greedy_row({3, 1}, 6)};
  EXPECT_EQ(hyps.at(0).tokens, generate(b, rows, 10, SpecialTokens{})[0].tokens);
}

}  // namespace
}  // namespace megatron::inference
