// Megatron's stop rules with the GPT-2 tokenizer through the server: the special ids come from
// the tokenizer (EOD 50256, "\n" 198, "\n\n" 628, ":" 25, as Megatron hard-codes them), and
// stop_on_eol / stop_on_double_eol / prevent_newline_after_colon behave as in Megatron.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/log.h"
#include "data/tokenizer.h"
#include "fake_model.h"
#include "inference/generation.h"
#include "inference/server.h"
#include "test_util.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kVocab = megatron::testing::source_dir() / ".cache/gpt2/gpt2-vocab.json";
const fs::path kMerges = megatron::testing::source_dir() / ".cache/gpt2/gpt2-merges.txt";

std::unique_ptr<data::Tokenizer> gpt2() {
  data::TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = kVocab.string();
  o.merge_file = kMerges.string();
  return data::build_tokenizer(o);
}

// A model that always prefers "\n", then "\n\n", then " the".
void newline_lover(std::span<const int32_t>, std::span<float> logits) {
  for (auto& v : logits) v = 0.0f;
  logits[198] = 10.0f;
  logits[628] = 9.0f;
  logits[262] = 8.0f;
}

TEST(Gpt2StopRules, SpecialTokensAndServerStops) {
  if (!fs::exists(kVocab) || !fs::exists(kMerges))
    GTEST_SKIP() << "GPT-2 vocab missing; run scripts/get-corpus.sh";
  auto tok = gpt2();
  const auto special = SpecialTokens::from_tokenizer(*tok);
  EXPECT_EQ(special.eod, 50256);
  EXPECT_EQ(special.newline, 198);
  EXPECT_EQ(special.double_newline, 628);
  EXPECT_EQ(special.colon, 25);

  set_log_level(LogLevel::Warn);
  testing::FakeModel model(50304, 128, newline_lover);
  ServerOptions options;
  options.port = 0;
  TextGenerationServer server(model, *tok, options);
  const int port = server.bind();
  std::thread serving([&] { server.serve(); });
  httplib::Client c("127.0.0.1", port);
  auto api = [&](json body) {
    auto r = c.Put("/api", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? json::parse(r->body) : json();
  };
  const json base = {{"tokens_to_generate", 5}, {"top_k", 1}};
  json b = base;
  b["prompts"] = {"Hello"};
  EXPECT_EQ(api(b)["text"][0], "Hello\n\n\n\n\n");  // no stop rule: five "\n"
  b["stop_on_eol"] = true;
  EXPECT_EQ(api(b)["text"][0], "Hello\n");
  b.erase("stop_on_eol");
  b["stop_on_double_eol"] = true;
  EXPECT_EQ(api(b)["text"][0], "Hello\n\n");  // two consecutive "\n" tokens
  b = base;
  b["prompts"] = {"Q:"};
  b["prevent_newline_after_colon"] = true;
  b["stop_on_eol"] = true;
  const json r = api(b);
  EXPECT_EQ(r["tokens"][0].back(), 628);  // "\n" banned after ":", so "\n\n", which stops
  EXPECT_EQ(r["segments"][0].back(), "\n\n");
  // OpenAI stop strings cut the text.
  auto o = c.Post("/v1/completions",
                  json{{"prompt", "Hi"}, {"max_tokens", 4}, {"temperature", 0}, {"stop", "\n\n"}}.dump(),
                  "application/json");
  ASSERT_TRUE(o && o->status == 200);
  EXPECT_EQ(json::parse(o->body)["choices"][0]["text"], "");  // "\n\n\n\n" cut at its first "\n\n"
  EXPECT_EQ(json::parse(o->body)["choices"][0]["finish_reason"], "stop");
  server.stop();
  serving.join();
}

}  // namespace
}  // namespace megatron::inference
