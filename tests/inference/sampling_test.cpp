// Sampling rules on hand-built logits: greedy, temperature, top-k, top-p, decay, padding.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "inference/sampling.h"

namespace megatron::inference {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

// Empirical distribution of `draws` samples.
std::vector<double> frequencies(const std::vector<float>& logits, int64_t vocab,
                                const SamplingParams& params, float top_p, int draws = 40000) {
  SamplingStream stream(1234, 0);
  std::vector<float> s1;
  std::vector<int32_t> s2;
  std::vector<double> f(size_t(vocab), 0.0);
  for (int i = 0; i < draws; ++i) f[size_t(sample_token(logits, vocab, params, top_p, stream.next(), s1, s2))] += 1.0 / draws;
  return f;
}

TEST(Sampling, GreedyIsArgmaxFirstOnTies) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  SamplingParams p;
  p.top_k = 1;
  p.temperature = 50.0f;  // ignored when greedy
  std::vector<float> s1;
  std::vector<int32_t> s2;
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(l, 4, p, 0.0f, u, s1, s2), 1);
}

TEST(Sampling, TemperatureMatchesSoftmax) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  SamplingParams p;
  p.temperature = 2.0f;
  const auto f = frequencies(logits_of(probs), 4, p, 0.0f);
  double z = 0;
  for (double q : probs) z += std::sqrt(q);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(f[i], std::sqrt(probs[i]) / z, 0.01) << i;
}

TEST(Sampling, TopKKeepsOnlyTheKBest) {
  const std::vector<double> probs = {0.05, 0.4, 0.1, 0.3, 0.15};
  SamplingParams p;
  p.top_k = 2;
  const auto f = frequencies(logits_of(probs), 5, p, 0.0f);
  EXPECT_EQ(f[0] + f[2] + f[4], 0.0);
  EXPECT_NEAR(f[1], 0.4 / 0.7, 0.01);
  EXPECT_NEAR(f[3], 0.3 / 0.7, 0.01);
}

TEST(Sampling, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  SamplingParams p;
  p.top_p = 0.6f;
  // Sorted: 0.5, 0.3 (mass before it 0.5 <= 0.6: kept), 0.15 (0.8 > 0.6: dropped), 0.05.
  auto f = frequencies(logits_of(probs), 4, p, p.top_p);
  EXPECT_EQ(f[0] + f[2], 0.0);
  EXPECT_NEAR(f[1], 0.5 / 0.8, 0.01);
  EXPECT_NEAR(f[3], 0.3 / 0.8, 0.01);
  // A tiny p still keeps the most likely token.
  f = frequencies(logits_of(probs), 4, p, 0.01f, 2000);
  EXPECT_NEAR(f[1], 1.0, 1e-9);
}

TEST(Sampling, ZeroTopKAndTopPIsPureSamplingNotGreedy) {
  const std::vector<double> probs = {0.25, 0.75};
  SamplingParams p;  // top_k 0, top_p 0, temperature 1
  const auto f = frequencies(logits_of(probs), 2, p, 0.0f);
  EXPECT_NEAR(f[0], 0.25, 0.01);
}

TEST(Sampling, PaddedVocabularyIsNeverSampled) {
  std::vector<float> l = {0.0f, 0.0f, 100.0f, 100.0f};  // entries 2, 3 are padding
  SamplingParams p;
  const auto f = frequencies(l, 2, p, 0.0f, 2000);
  EXPECT_NEAR(f[0] + f[1], 1.0, 1e-9);
  p.top_k = 1;
  std::vector<float> s1;
  std::vector<int32_t> s2;
  EXPECT_LT(sample_token(l, 2, p, 0.0f, 0.3, s1, s2), 2);
}

TEST(Sampling, TopPDecayAndBound) {
  SamplingParams p;
  p.top_p = 0.9f;
  p.top_p_decay = 0.5f;
  p.top_p_bound = 0.3f;
  float t = p.top_p;
  t = next_top_p(p, t);
  EXPECT_FLOAT_EQ(t, 0.45f);
  t = next_top_p(p, t);
  EXPECT_FLOAT_EQ(t, 0.3f);
  p.top_p_decay = 0.0f;
  EXPECT_FLOAT_EQ(next_top_p(p, 0.7f), 0.7f);
}

TEST(Sampling, StreamsAreReproducibleAndDistinct) {
  SamplingStream a(7, 0), b(7, 0), c(7, 1), d(8, 0);
  for (int i = 0; i < 10; ++i) {
    const double x = a.next();
    EXPECT_EQ(x, b.next());
    EXPECT_NE(x, c.next());
    EXPECT_NE(x, d.next());
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
  }
}

TEST(Sampling, LogprobIsLogSoftmax) {
  std::vector<float> l = {1.0f, 2.0f, 3.0f};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(token_logprob(l, 1), 2.0 - std::log(z), 1e-6);
  std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(token_logprob(big, 0), std::log(0.5), 1e-6);
}

}  // namespace
}  // namespace megatron::inference
