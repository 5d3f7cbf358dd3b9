// Continuous batching: sequences with different prompts, lengths and sampling settings that join
// a running batch at different steps (and reuse freed slots) give exactly what each gives alone.
#include <gtest/gtest.h>

#include <map>

#include "fake_model.h"
#include "inference/batch_engine.h"
#include "inference/generation.h"
#include "inference/gpt_engine.h"
#include "tiny_gpt.h"

namespace megatron::inference {
namespace {

using testing::FakeModel;

constexpr int64_t kVocab = 30;

SpecialTokens special_tokens() {
  SpecialTokens s;
  s.eod = 29;
  s.newline = 27;
  s.double_newline = 28;
  s.colon = 26;
  return s;
}

// A mix of everything a row can ask for.
std::vector<SequenceRequest> mixed_requests() {
  std::vector<SequenceRequest> rows;
  auto add = [&](std::vector<int32_t> prompt, int64_t n) -> SequenceRequest& {
    SequenceRequest r;
    r.prompt = std::move(prompt);
    r.tokens_to_generate = n;
    r.seed = 1000 + rows.size();
    r.sequence = rows.size() % 2;
    rows.push_back(std::move(r));
    return rows.back();
  };
  auto& a = add({1, 2, 3}, 12);
  a.sampling.top_k = 1;
  a.return_logprobs = true;
  a.top_logprobs = 2;
  auto& b = add({4}, 20);
  b.sampling.temperature = 0.8f;
  auto& c = add({5, 6, 7, 8, 9, 10}, 5);
  c.sampling.top_k = 5;
  c.return_logprobs = true;
  auto& d = add({11, 12}, 15);
  d.sampling.top_p = 0.9f;
  d.sampling.top_p_decay = 0.9f;
  d.sampling.top_p_bound = 0.5f;
  d.stop_on_eol = true;
  d.prevent_newline_after_colon = true;
  auto& e = add({13, 14, 15, 16}, 0);  // scoring only
  e.return_logprobs = true;
  e.top_logprobs = 3;
  auto& f = add({2, 2}, 9);
  f.sampling.temperature = 1.3f;
  f.stop_on_double_eol = true;
  auto& g = add({7}, 18);  // ended by its callback after 4 tokens
  g.sampling.temperature = 0.5f;
  g.on_token = [](std::span<const int32_t> tokens, float) { return tokens.size() < 5; };
  auto& h = add({3, 1, 4, 1, 5, 9, 2, 6}, 7);
  h.sampling.top_k = 1;
  h.stop_on_eod = false;
  return rows;
}

void expect_same(const SequenceResult& got, const SequenceResult& want, double tolerance,
                 size_t row) {
  EXPECT_EQ(got.tokens, want.tokens) << "row " << row;
  EXPECT_EQ(got.prompt_length, want.prompt_length) << "row " << row;
  EXPECT_EQ(got.finish, want.finish) << "row " << row;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << "row " << row;
  for (size_t j = 0; j < got.logprobs.size(); ++j) {
    if (tolerance == 0.0) EXPECT_EQ(got.logprobs[j], want.logprobs[j]) << "row " << row << " @" << j;
    else EXPECT_NEAR(got.logprobs[j], want.logprobs[j], tolerance) << "row " << row << " @" << j;
  }
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << "row " << row;
  for (size_t j = 0; j < got.top_logprobs.size(); ++j) {
    ASSERT_EQ(got.top_logprobs[j].size(), want.top_logprobs[j].size());
    for (size_t k = 0; k < got.top_logprobs[j].size(); ++k) {
      EXPECT_EQ(got.top_logprobs[j][k].first, want.top_logprobs[j][k].first);
      EXPECT_NEAR(got.top_logprobs[j][k].second, want.top_logprobs[j][k].second, tolerance);
    }
  }
}

// Admits request i at step join[i] (or later, first come first served, when no slot is free)
// and steps until every sequence is done. Returns the results by request index.
std::vector<SequenceResult> run_engine(BatchEngine& engine, const std::vector<SequenceRequest>& rows,
                                       const std::vector<int64_t>& join, int64_t* max_running) {
  std::map<uint64_t, SequenceResult> done;
  size_t next = 0;
  for (int64_t step = 0; done.size() < rows.size(); ++step) {
    while (next < rows.size() && join[next] <= step && engine.free_slots() > 0) {
      engine.admit(rows[next], next, int64_t(next));
      ++next;
    }
    *max_running = std::max(*max_running, engine.running());
    for (auto& f : engine.step()) done[f.id] = std::move(f.result);
    EXPECT_LT(step, 1000) << "the engine does not finish";
    if (step >= 1000) break;
  }
  std::vector<SequenceResult> out;
  for (auto& [id, r] : done) out.push_back(std::move(r));
  return out;
}

TEST(BatchEngine, JoiningSequencesEqualEachAlone) {
  const auto rows = mixed_requests();
  const std::vector<int64_t> join = {0, 0, 2, 3, 3, 7, 7, 9};
  FakeModel model(32, 64);
  BatchEngine engine(model, kVocab, special_tokens(), 3);
  int64_t max_running = 0;
  const auto got = run_engine(engine, rows, join, &max_running);
  ASSERT_EQ(got.size(), rows.size());
  EXPECT_EQ(max_running, 3);
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.free_slots(), 3);
  // The cache started at the first sequence's length (15) and doubled once for the second (21).
  EXPECT_EQ(engine.cache_length(), 30);
  EXPECT_EQ(model.grows, 1);
  // Some forwards mixed rows (batching happened) and never more than the slots.
  EXPECT_GT(*std::max_element(model.batch_sizes.begin(), model.batch_sizes.end()), 1);
  EXPECT_LE(*std::max_element(model.batch_sizes.begin(), model.batch_sizes.end()), 3);
  for (size_t i = 0; i < rows.size(); ++i) {
    FakeModel alone_model(32, 64);
    std::vector<SequenceRequest> one = {rows[i]};
    const auto want = generate(alone_model, one, kVocab, special_tokens());
    expect_same(got[i], want[0], 0.0, i);
  }
  // The rows exercise what they should: a callback end, an EOL stop or EOD, a scoring row.
  EXPECT_EQ(got[6].finish, FinishReason::Callback);
  EXPECT_EQ(got[6].generated(), 4);
  EXPECT_EQ(got[4].generated(), 0);
  EXPECT_EQ(got[4].logprobs.size(), 3u);
}

TEST(BatchEngine, OneSlotRunsSequencesOneAfterAnother) {
  const auto rows = mixed_requests();
  FakeModel model(32, 64);
  BatchEngine engine(model, kVocab, special_tokens(), 1);
  int64_t max_running = 0;
  const auto got = run_engine(engine, rows, std::vector<int64_t>(rows.size(), 0), &max_running);
  EXPECT_EQ(max_running, 1);
  for (size_t i = 0; i < rows.size(); ++i) {
    FakeModel alone_model(32, 64);
    std::vector<SequenceRequest> one = {rows[i]};
    expect_same(got[i], generate(alone_model, one, kVocab, special_tokens())[0], 0.0, i);
  }
  for (int64_t b : model.batch_sizes) EXPECT_EQ(b, 1);
}

TEST(BatchEngine, RejectsWhatDoesNotFitAndNeedsSlots) {
  FakeModel model(32, 16);
  BatchEngine engine(model, kVocab, special_tokens(), 2);
  SequenceRequest r;
  r.prompt = {1, 2, 3};
  r.tokens_to_generate = 14;
  EXPECT_THROW(engine.validate(r, 0), Error);
  EXPECT_THROW(engine.admit(r, 0), Error);
  EXPECT_EQ(engine.free_slots(), 2);
  r.prompt = {};
  EXPECT_THROW(engine.admit(r, 0), Error);
  r.prompt = {31};
  r.tokens_to_generate = 1;
  EXPECT_THROW(engine.admit(r, 0), Error);  // outside the vocabulary
}

// The real network: sequences joining mid-generation (slots reused, stale cache entries left
// behind by earlier sequences) give the tokens of each alone, log-probs within fp tolerance.
class BatchEngineGPT : public ::testing::TestWithParam<int> {};

TEST_P(BatchEngineGPT, JoiningSequencesEqualEachAlone) {
  const auto c = GetParam() == 0 ? testing::gpt2_config() : testing::llama_config();
  const auto w = testing::random_weights(c);
  auto rows = mixed_requests();  // prompt + tokens <= 26 < 32 positions
  const std::vector<int64_t> join = {0, 0, 1, 4, 4, 5, 6, 11};
  GPTEngine model(c, w);
  BatchEngine engine(model, kVocab, special_tokens(), 3);
  int64_t max_running = 0;
  const auto got = run_engine(engine, rows, join, &max_running);
  ASSERT_EQ(got.size(), rows.size());
  EXPECT_EQ(max_running, 3);
  GPTEngine alone(c, w);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<SequenceRequest> one = {rows[i]};
    expect_same(got[i], generate(alone, one, kVocab, special_tokens())[0], 1e-4, i);
  }
}

// The cache starts at the first sequence's length and grows, keeping what the running sequence
// has cached, when a longer one joins mid-generation.
TEST_P(BatchEngineGPT, TheCacheGrowsWhenALongerSequenceJoins) {
  const auto c = GetParam() == 0 ? testing::gpt2_config() : testing::llama_config();
  const auto w = testing::random_weights(c);
  std::vector<SequenceRequest> rows(2);
  rows[0].prompt = {1, 2, 3};
  rows[0].tokens_to_generate = 5;
  rows[0].sampling.top_k = 1;
  rows[0].stop_on_eod = false;
  rows[1].prompt = {4, 5, 6, 7};
  rows[1].tokens_to_generate = 20;
  rows[1].sampling.temperature = 0.9f;
  rows[1].seed = 5;
  rows[1].return_logprobs = true;
  rows[1].stop_on_eod = false;
  GPTEngine model(c, w);
  BatchEngine engine(model, kVocab, special_tokens(), 2);
  int64_t max_running = 0;
  const auto got = run_engine(engine, rows, {0, 2}, &max_running);
  EXPECT_EQ(max_running, 2);
  EXPECT_EQ(engine.cache_length(), 24);  // max(24, 2 x 8)
  GPTEngine alone(c, w);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<SequenceRequest> one = {rows[i]};
    expect_same(got[i], generate(alone, one, kVocab, special_tokens())[0], 1e-4, i);
  }
  EXPECT_EQ(got[0].generated(), 5);
  EXPECT_EQ(got[1].generated(), 20);
}

INSTANTIATE_TEST_SUITE_P(Configs, BatchEngineGPT, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "Gpt2" : "Llama"; });

}  // namespace
}  // namespace megatron::inference
