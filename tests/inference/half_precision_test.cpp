// Inference with the weights kept in bf16 / fp16 (generate, serve and evaluate --bf16 / --fp16):
// the loader builds the model with params_dtype bf16/fp16, the weights take half the fp32 bytes
// (between calls too: the fp32 working copies exist only while a module runs), and the log-probs
// are within half-precision rounding of the fp32 model's and differ from them. fp16 computes in
// fp32 on the CPU: its log-probs are those of the fp32 model run on the weights rounded to fp16,
// bit for bit. bf16's linear products are bf16 products: within bf16 rounding of that model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "inference/generation.h"
#include "inference/model_loader.h"
#include "kernels/ops.h"
#include "test_util.h"
#include "tiny_gpt.h"

namespace megatron::inference {
namespace {

namespace mt = megatron::testing;

// Every weight rounded (round to nearest even) to `dtype` and back to fp32.
testing::Weights rounded(const testing::Weights& w, DType dtype) {
  testing::Weights out;
  for (const auto& [name, t] : w) {
    Tensor half = Tensor::empty(t.shape(), dtype);
    ops::cast(half, t);
    Tensor back = Tensor::empty(t.shape(), DType::F32);
    ops::cast(back, half);
    out[name] = back;
  }
  return out;
}

InferenceModel load(const mt::TempDir& dir, const testing::Config& c, DType dtype) {
  InferenceModelOptions o;
  o.load = dir.path().string();
  o.model = c;
  o.model.params_dtype = dtype;
  o.make_vocab_size_divisible_by = 64;
  o.tokenizer.type = "NullTokenizer";
  o.tokenizer.vocab_size = 60;
  return load_inference_model(o);
}

// Log-probs of every prompt token after the first (teacher forced: the same tokens whatever the
// precision) for three prompts, plus 6 greedy tokens (which must run through the KV cache).
std::vector<float> score(LanguageModel& m) {
  std::vector<SequenceRequest> rows(3);
  rows[0].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  rows[1].prompt = {9, 8, 40, 41, 3};
  rows[2].prompt = {5, 17, 33, 2, 40, 12, 12, 50};
  for (auto& r : rows) {
    r.tokens_to_generate = 0;
    r.return_logprobs = true;
  }
  std::vector<float> out;
  for (const auto& r : generate(m, rows, 60, SpecialTokens{}))
    out.insert(out.end(), r.logprobs.begin(), r.logprobs.end());
  return out;
}

class HalfPrecisionInference : public ::testing::TestWithParam<const char*> {};

TEST_P(HalfPrecisionInference, WeightsStayHalfAndLogProbsAreThoseOfTheRoundedWeights) {
  const std::string arch = GetParam();
  const testing::Config c = arch == "llama" ? testing::llama_config() : testing::gpt2_config();
  const testing::Weights w = testing::random_weights(c);
  mt::TempDir dir;
  testing::write_checkpoint(dir.path(), w, 3);
  InferenceModel fp32 = load(dir, c, DType::F32);
  const std::vector<float> ref = score(*fp32.model);
  size_t fp32_bytes = 0;
  for (const auto& [name, t] : w) fp32_bytes += t.nbytes();
  auto& fp32_engine = dynamic_cast<GPTEngine&>(*fp32.model);
  EXPECT_EQ(fp32_engine.model().weight_bytes(), fp32_bytes);  // no second copy in fp32 either

  // Half precision within this many nats of fp32 (bf16 keeps 8 significant bits, fp16 11: these
  // random weights are large, so the log-probs move by up to 0.08 and 0.01 nats). fp16's
  // differences are several times smaller than bf16's.
  std::vector<double> diffs;
  for (auto [dtype, tol] : {std::pair{DType::BF16, 0.2}, std::pair{DType::F16, 0.03}}) {
    SCOPED_TRACE(dtype_name(dtype));
    InferenceModel half = load(dir, c, dtype);
    auto& engine = dynamic_cast<GPTEngine&>(*half.model);
    for (model::Parameter* p : engine.model().parameters())
      ASSERT_EQ(p->value.dtype(), dtype) << p->name;
    EXPECT_EQ(engine.model().weight_bytes(), fp32_bytes / 2);  // loaded: half the bytes
    const std::vector<float> got = score(*half.model);
    EXPECT_EQ(engine.model().weight_bytes(), fp32_bytes / 2);  // and after running
    ASSERT_EQ(got.size(), ref.size());
    double max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(got[i] - ref[i])));
    std::printf("%s: max |log-prob - fp32's| = %g\n", dtype_name(dtype), max_diff);
    EXPECT_GT(max_diff, 0.0) << "the half-precision weights must change the log-probs";
    EXPECT_LT(max_diff, tol);
    diffs.push_back(max_diff);
    GPTEngine on_rounded(c, rounded(w, dtype));
    std::vector<SequenceRequest> row(1);
    row[0].prompt = {3, 1, 4, 1, 5};
    row[0].tokens_to_generate = 8;
    row[0].return_logprobs = true;
    row[0].stop_on_eod = false;
    row[0].sampling.top_k = 1;
    const auto g = generate(*half.model, row, 60, SpecialTokens{});
    if (!ops::gemm_computes_in(dtype, Device::cpu())) {
      // Computed in fp32 (fp16 without fp16 products): the fp32 model over the rounded weights
      // computes exactly the same thing, and so does greedy continuation through the KV cache.
      EXPECT_EQ(got, score(on_rounded));
      const auto g_ref = generate(on_rounded, row, 60, SpecialTokens{});
      EXPECT_EQ(g[0].tokens, g_ref[0].tokens);
      EXPECT_EQ(g[0].logprobs, g_ref[0].logprobs);
    } else {
      // bf16 products (inputs rounded to bf16, fp32 accumulation): within bf16 rounding of the
      // fp32 model over the same weights, and not equal to it.
      const std::vector<float> on_same = score(on_rounded);
      ASSERT_EQ(got.size(), on_same.size());
      double d = 0;
      for (size_t i = 0; i < got.size(); ++i) d = std::max(d, double(std::fabs(got[i] - on_same[i])));
      EXPECT_GT(d, 0.0);
      EXPECT_LT(d, tol);
      // Greedy continuation through the KV cache (one-row products) agrees with a full forward
      // of the same model over prompt and continuation, up to the order of the fp32 sums.
      std::vector<SequenceRequest> whole(1);
      whole[0].prompt = g[0].tokens;
      whole[0].tokens_to_generate = 0;
      whole[0].return_logprobs = true;
      const auto f = generate(*half.model, whole, 60, SpecialTokens{});
      ASSERT_EQ(f[0].logprobs.size(), g[0].logprobs.size());
      for (size_t i = 0; i < g[0].logprobs.size(); ++i)
        EXPECT_NEAR(f[0].logprobs[i], g[0].logprobs[i], 1e-3) << "token " << i;
    }
  }
  ASSERT_EQ(diffs.size(), 2u);
  EXPECT_LT(diffs[1] * 3, diffs[0]) << "fp16 rounds to 3 more bits than bf16";
}

INSTANTIATE_TEST_SUITE_P(Architectures, HalfPrecisionInference, ::testing::Values("gpt2", "llama"));

TEST(HalfPrecisionInferenceErrors, AWeightBeyondTheFp16RangeNamesItAndSuggestsBf16) {
  const testing::Config c = testing::gpt2_config();
  testing::Weights w = testing::random_weights(c);
  w["decoder.layers.1.mlp.linear_fc2.weight"].data<float>()[5] = 1.0e5f;  // finite, > 65504
  mt::TempDir dir;
  testing::write_checkpoint(dir.path(), w, 3);
  EXPECT_NO_THROW(load(dir, c, DType::BF16));
  try {
    load(dir, c, DType::F16);
    ADD_FAILURE() << "a weight beyond the fp16 range must not load as fp16";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("decoder.layers.1.mlp.linear_fc2.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("--bf16"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace megatron::inference
