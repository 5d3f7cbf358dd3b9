// Sampling rules on hand-built logits: greedy, temperature, top-k, top-p, decay, padding.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "inference/sampling.h"
#include "test_util.h"

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

// Every setting outside its range is refused with the setting's name, its range and the value
// given; a denormal temperature (1e-40 as a float) is below the range, not a division by it.
TEST(Sampling, SettingsOutsideTheirRangesAreNamedWithTheirLimits) {
  SamplingParams ok;
  ok.top_p = 0.9f;
  ok.top_p_decay = 0.5f;
  ok.top_p_bound = 0.2f;
  EXPECT_EQ(sampling_params_error(ok, kRequestFieldNames), "");
  struct Case {
    SamplingParams p;
    std::vector<std::string> says;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return p;
  };
  const Case cases[] = {
      {with([](auto& p) { p.temperature = 1e-40f; }),
       {"temperature must be a number in [1.17549e-38, 100], got 9.99995e-41", "smallest normal",
        "top_k=1"}},
      {with([](auto& p) { p.temperature = 0.0f; }), {"temperature must be a number in", "got 0"}},
      {with([&](auto& p) { p.temperature = nan; }), {"temperature", "got nan"}},
      {with([&](auto& p) { p.temperature = inf; }), {"temperature", "got inf"}},
      {with([](auto& p) { p.temperature = 100.5f; }), {"temperature", "100.5"}},
      {with([](auto& p) { p.top_k = -1; }), {"top_k must be an integer in [0, 1000], got -1"}},
      {with([](auto& p) { p.top_k = 1001; }), {"top_k", "1001"}},
      {with([&](auto& p) { p.top_p = nan; }), {"top_p must be a number in [0, 1], got nan"}},
      {with([](auto& p) { p.top_p = 1.5f; }), {"top_p must be a number in [0, 1], got 1.5"}},
      {with([](auto& p) { p.top_p = 0.5f, p.top_p_decay = -0.1f; }), {"top_p_decay", "[0, 1]"}},
      {with([](auto& p) { p.top_p_decay = 0.5f; }), {"top_p_decay needs top_p"}},
      {with([](auto& p) { p.top_p = 0.5f, p.top_p_bound = 0.6f; }),
       {"top_p_bound (0.6) must not exceed top_p (0.5)"}},
      {with([](auto& p) { p.top_k = 5, p.top_p = 0.5f; }), {"cannot set both top_k (5) and top_p"}},
  };
  for (const Case& c : cases) {
    const std::string e = sampling_params_error(c.p, kRequestFieldNames);
    for (const std::string& s : c.says) EXPECT_NE(e.find(s), std::string::npos) << s << " in: " << e;
  }
  // The command line's names.
  EXPECT_NE(sampling_params_error(cases[0].p, kFlagNames).find("--temperature must be"),
            std::string::npos);
  // sample_token checks too: an Error naming the setting, never an internal error.
  std::vector<float> l = {1.0f, 2.0f};
  std::vector<float> s1;
  std::vector<int32_t> s2;
  const std::string e = testing::error_of([&] { sample_token(l, 2, cases[0].p, 0.0f, 0.5, s1, s2); });
  EXPECT_NE(e.find("invalid sampling settings: temperature must be"), std::string::npos) << e;
}

// Any accepted temperature samples: the smallest puts all the mass on the largest logit (ties
// shared), even for logits whose quotient by the temperature overflows a float or a double.
TEST(Sampling, TheSmallestTemperaturesSampleTheLargestLogits) {
  std::vector<float> s1;
  std::vector<int32_t> s2;
  for (float t : {float(kMinTemperature), 1e-30f, 1e-6f}) {
    SamplingParams p;
    p.temperature = t;
    const std::vector<float> l = {-3e38f, 1.0f, 1e30f, 0.5f, -1e30f};
    for (double u : {0.0, 0.3, 0.999999}) EXPECT_EQ(sample_token(l, 5, p, 0.0f, u, s1, s2), 2) << t;
    const std::vector<float> tie = {5.0f, 7.0f, 7.0f, -1.0f};
    EXPECT_EQ(sample_token(tie, 4, p, 0.0f, 0.25, s1, s2), 1) << t;
    EXPECT_EQ(sample_token(tie, 4, p, 0.0f, 0.75, s1, s2), 2) << t;
  }
}

// NaN or +inf logits (a broken model) are an Error saying so, for greedy and sampled rows.
TEST(Sampling, NonFiniteLogitsAreAnErrorNamingThem) {
  std::vector<float> s1;
  std::vector<int32_t> s2;
  for (int top_k : {0, 1, 2}) {
    SamplingParams p;
    p.top_k = top_k;
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      const std::vector<float> l = {0.5f, bad, 1.0f};
      try {
        sample_token(l, 3, p, 0.0f, 0.5, s1, s2);
        ADD_FAILURE() << "no error for " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("logits are not finite"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("for token 1"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace megatron::inference
