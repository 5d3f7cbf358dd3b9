// `generate` and `serve` with --bf16 / --fp16 (the weights kept in that precision) and `serve
// --seed` (the sampling of requests without their own random_seed), end to end on the tiny
// random GPT: outputs against the engine run in-process with the same settings.
#include <gtest/gtest.h>

#include <cmath>

#include "cli_test_util.h"
#include "inference/generation.h"
#include "serve_process.h"

namespace megatron::inference {
namespace {

namespace mt = megatron::testing;
using json = nlohmann::json;
using testing::Checkpoint;
using testing::kModelFlags;

const std::vector<std::vector<int32_t>> kPrompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {9, 8, 40, 41, 3, 3}};

// What the engine gives in-process for the prompts' log-probs (scored, nothing generated) and
// 6 greedy tokens after the first prompt, with the weights in `dtype`.
struct EngineRun {
  std::vector<std::vector<float>> scores;
  SequenceResult greedy;
};
EngineRun engine_run(const testing::Weights& w, DType dtype) {
  testing::Config c = testing::gpt2_config();
  c.params_dtype = dtype;
  GPTEngine model(c, w);
  std::vector<SequenceRequest> rows(kPrompts.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].prompt = kPrompts[i];
    rows[i].tokens_to_generate = 0;
    rows[i].return_logprobs = true;
  }
  EngineRun out;
  for (auto& r : generate(model, rows, 60, SpecialTokens{})) out.scores.push_back(r.logprobs);
  std::vector<SequenceRequest> g(1);
  g[0].prompt = kPrompts[0];
  g[0].tokens_to_generate = 6;
  g[0].return_logprobs = true;
  g[0].sampling.top_k = 1;
  SpecialTokens special;
  special.eod = 59;
  out.greedy = generate(model, g, 60, special)[0];
  return out;
}

std::string prompt_flags() {
  std::string s;
  for (const auto& p : kPrompts) {
    s += " --prompt '";
    for (size_t i = 0; i < p.size(); ++i) s += (i ? " " : "") + std::to_string(p[i]);
    s += "'";
  }
  return s;
}

TEST(HalfPrecisionCommands, GenerateWithBf16AndFp16ScoresLikeTheHalfWeightEngine) {
  Checkpoint ckpt;
  const std::string base = "generate --load " + ckpt.dir.path().string() + kModelFlags + prompt_flags() +
                           " --num-tokens-to-generate 0 --return-log-probs --output-format jsonl";
  const auto fp32 = mt::run_cli(base);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const auto fp32_lines = testing::json_lines(fp32.output);
  ASSERT_EQ(fp32_lines.size(), 2u) << fp32.output;
  size_t fp32_bytes = 0;
  for (const auto& [name, t] : ckpt.weights) fp32_bytes += t.nbytes();
  EXPECT_NE(fp32.output.find("weights in float32, " + std::to_string(fp32_bytes) + " bytes"),
            std::string::npos) << fp32.output;
  for (auto [flag, dtype, tol] : {std::tuple{"--bf16", DType::BF16, 0.2}, std::tuple{"--fp16", DType::F16, 0.03}}) {
    SCOPED_TRACE(flag);
    const auto r = mt::run_cli(base + " " + flag);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The loader reports the weights' precision and bytes: half of fp32's.
    EXPECT_NE(r.output.find(std::string("weights in ") + dtype_name(dtype) + ", " +
                            std::to_string(fp32_bytes / 2) + " bytes"),
              std::string::npos) << r.output;
    const auto lines = testing::json_lines(r.output);
    ASSERT_EQ(lines.size(), 2u) << r.output;
    const EngineRun want = engine_run(ckpt.weights, dtype);
    double max_diff = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const auto got = lines[i]["logprobs"].get<std::vector<float>>();
      EXPECT_EQ(got, want.scores[i]);  // bit for bit: the half-weight engine's
      const auto ref = fp32_lines[i]["logprobs"].get<std::vector<float>>();
      ASSERT_EQ(got.size(), ref.size());
      for (size_t k = 0; k < got.size(); ++k) max_diff = std::max(max_diff, double(std::fabs(got[k] - ref[k])));
    }
    EXPECT_GT(max_diff, 0.0) << "the flag must change the weights";
    EXPECT_LT(max_diff, tol);
  }
  const auto both = mt::run_cli(base + " --fp16 --bf16");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.output.find("cannot be combined"), std::string::npos) << both.output;
}

TEST(HalfPrecisionCommands, ServeWithFp16AnswersPutApi) {
  Checkpoint ckpt;
  testing::ServeProcess server("--load " + ckpt.dir.path().string() + kModelFlags + " --fp16",
                               ckpt.dir.path() / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string log = server.log();
  size_t fp32_bytes = 0;
  for (const auto& [name, t] : ckpt.weights) fp32_bytes += t.nbytes();
  EXPECT_NE(log.find("weights in float16, " + std::to_string(fp32_bytes / 2) + " bytes"),
            std::string::npos) << log;
  auto r = server.put_api(R"({"prompts": ["1 2 3 4 5 6 7 8"], "tokens_to_generate": 6, "top_k": 1, "logprobs": true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  const EngineRun want = engine_run(ckpt.weights, DType::F16);
  EXPECT_EQ(body["tokens"][0].get<std::vector<int32_t>>(), want.greedy.tokens);
  EXPECT_EQ(body["logprobs"][0].get<std::vector<float>>(), want.greedy.logprobs);
  EXPECT_TRUE(server.stop()) << server.log();
}

// evaluate --bf16: the weights in bf16 (half the bytes), the LAMBADA loss within bf16 rounding of
// the fp32 one and not equal to it.
TEST(HalfPrecisionCommands, EvaluateWithBf16KeepsHalfWeights) {
  Checkpoint ckpt;
  const auto data = ckpt.dir.path() / "lambada.jsonl";
  mt::write_file(data, "{\"text\": \"1 4 7 10 13 16 19\"}\n{\"text\": \"2 5 8 11 14\"}\n"
                       "{\"text\": \"30 20 10 40 50 3 9 27\"}\n");
  const std::string base = "evaluate --task LAMBADA --valid-data " + data.string() + " --load " +
                           ckpt.dir.path().string() + kModelFlags;
  auto loss_sum = [](const std::string& out) {
    const size_t at = out.find("loss sum ");
    return at == std::string::npos ? std::nan("") : std::atof(out.c_str() + at + 9);
  };
  const auto fp32 = mt::run_cli(base);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const auto bf16 = mt::run_cli(base + " --bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  size_t fp32_bytes = 0;
  for (const auto& [name, t] : ckpt.weights) fp32_bytes += t.nbytes();
  EXPECT_NE(bf16.output.find("weights in bfloat16, " + std::to_string(fp32_bytes / 2) + " bytes"),
            std::string::npos) << bf16.output;
  const double a = loss_sum(fp32.output), b = loss_sum(bf16.output);
  ASSERT_TRUE(std::isfinite(a) && std::isfinite(b)) << fp32.output << bf16.output;
  EXPECT_NE(a, b);
  EXPECT_NEAR(a, b, 0.1 + 0.01 * std::fabs(a));
}

// Megatron seeds its generator with --seed at start-up and samples a request without
// "random_seed" from it: the same --seed gives the same text for the same requests; another
// seed other text; a request's own random_seed wins over --seed.
TEST(ServeSeed, SeedsTheSamplingOfRequestsWithoutRandomSeed) {
  Checkpoint ckpt;
  const std::string sampled = R"({"prompts": ["1 2 3"], "tokens_to_generate": 16, "top_k": 0, "temperature": 4.0)";
  int run = 0;
  auto answers = [&](int seed) {
    testing::ServeProcess server("--load " + ckpt.dir.path().string() + kModelFlags +
                                     " --seed " + std::to_string(seed),
                                 ckpt.dir.path() / ("serve" + std::to_string(++run) + ".log"));
    std::vector<std::vector<int32_t>> out;
    EXPECT_GT(server.port(), 0) << server.log();
    if (server.port() == 0) return out;
    for (const std::string& body : {sampled + "}", sampled + "}", sampled + R"(, "random_seed": 5})"}) {
      auto r = server.put_api(body);
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer: " + httplib::to_string(r.error())) << "\n" << server.log();
      if (r && r->status == 200) out.push_back(json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>());
    }
    EXPECT_TRUE(server.stop()) << server.log();
    return out;
  };
  const auto a = answers(7), b = answers(7), c = answers(8);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(a, b);            // same --seed: same answers, request by request
  EXPECT_NE(a[0], a[1]);      // the second request draws the next seed
  EXPECT_NE(a[0], c[0]);      // another --seed samples other text
  EXPECT_NE(a[1], c[1]);
  EXPECT_EQ(a[2], c[2]);      // random_seed wins over --seed
  const auto bad = mt::run_command("timeout 60 '" + mt::cli_path().string() + "' serve --load " +
                                   ckpt.dir.path().string() + kModelFlags + " --seed 0 --port 0");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--seed 0 must be a positive integer"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace megatron::inference
