// OpenAI "logprobs" of POST /v1/completions with the GPT-2 tokenizer: one entry per token even
// when a character spans several tokens (such tokens are shown as OpenAI shows them, "bytes:"
// and \xNN escapes), offsets that follow the text, and the cut at a stop string.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/gpt2_bpe.h"
#include "inference/server_api.h"
#include "test_util.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kGpt2 = megatron::testing::source_dir() / ".cache/gpt2";

// "bytes:\xe2\x80" -> the raw bytes; anything else as is.
std::string raw_of(const std::string& token) {
  if (token.rfind("bytes:", 0) != 0) return token;
  std::string out;
  for (size_t i = 6; i + 3 < token.size() + 1; i += 4) {
    EXPECT_EQ(token.substr(i, 2), "\\x") << token;
    out.push_back(char(std::stoi(token.substr(i + 2, 2), nullptr, 16)));
  }
  return out;
}

struct Gpt2Api {
  Gpt2Api()
      : tokenizer((kGpt2 / "gpt2-vocab.json").string(), (kGpt2 / "gpt2-merges.txt").string()) {
    ctx.tokenizer = &tokenizer;
    ctx.vocab = tokenizer.vocab_size();
    ctx.max_sequence_length = 64;
  }
  // Parses `body`, then finishes its job as if the engine had generated `generated`.
  json answer(const json& body, const std::vector<int32_t>& generated, FinishReason finish) {
    CompletionRequest req = parse_completion_request(body, ctx, 1, "cmpl-test");
    SequenceResult r;
    r.tokens = req.job->rows[0].prompt;
    r.prompt_length = int64_t(r.tokens.size());
    r.tokens.insert(r.tokens.end(), generated.begin(), generated.end());
    for (size_t j = 1; j < r.tokens.size(); ++j) {
      r.logprobs.push_back(-0.5f * float(j));
      r.top_logprobs.push_back({{r.tokens[j], -0.5f * float(j)}});
    }
    r.finish = finish;
    req.job->results = {r};
    return completion_response(req, ctx);
  }
  data::GPT2BPETokenizer tokenizer;
  ApiContext ctx;
};

TEST(CompletionLogprobs, OneEntryPerTokenWhenACharacterSpansTokens) {
  ASSERT_TRUE(fs::exists(kGpt2 / "gpt2-vocab.json")) << "run scripts/get-corpus.sh";
  Gpt2Api api;
  // 447 and 246 are the two parts of U+2018 (‘) in GPT-2's byte-level vocabulary.
  ASSERT_EQ(api.tokenizer.decode(std::vector<int32_t>{447, 246}), "\xe2\x80\x98");
  const std::vector<int32_t> generated = api.tokenizer.encode("s the jury");
  ASSERT_EQ(generated.size(), 3u);
  const json body = {{"prompt", {447, 246}}, {"max_tokens", 4}, {"temperature", 0},
                     {"echo", true}, {"logprobs", 1}};
  const json out = api.answer(body, generated, FinishReason::Length);
  const json& choice = out["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << lp.dump();  // 2 prompt + 3 generated
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  EXPECT_EQ(lp["tokens"][0], "bytes:\\xe2\\x80");
  EXPECT_EQ(lp["tokens"][1], "bytes:\\x98");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][4].get<float>(), -2.0f);
  // The top alternative at a partial-character position carries the same "bytes:" text.
  EXPECT_TRUE(lp["top_logprobs"][1].contains("bytes:\\x98")) << lp["top_logprobs"][1].dump();
  // The tokens' bytes, in order, are the returned text; the offsets point into it.
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size()) << i;
    joined += raw_of(lp["tokens"][i].get<std::string>());
  }
  EXPECT_EQ(joined, choice["text"].get<std::string>());
  EXPECT_EQ(choice["text"], "\xe2\x80\x98s the jury");
}

TEST(CompletionLogprobs, AStopStringEndsTheListAtTheTokenThatReachesIt) {
  ASSERT_TRUE(fs::exists(kGpt2 / "gpt2-vocab.json")) << "run scripts/get-corpus.sh";
  Gpt2Api api;
  const std::vector<int32_t> prompt = api.tokenizer.encode("The jury");
  const std::vector<int32_t> generated = api.tokenizer.encode(" said \xe2\x80\x9cno\xe2\x80\x9d. Then");
  const json body = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0},
                     {"logprobs", 0}, {"stop", "."}};
  const json out = api.answer(body, generated, FinishReason::Callback);
  const json& choice = out["choices"][0];
  EXPECT_EQ(choice["text"], " said \xe2\x80\x9cno\xe2\x80\x9d");
  EXPECT_EQ(choice["finish_reason"], "stop");
  const json& lp = choice["logprobs"];
  std::string joined;
  for (const auto& t : lp["tokens"]) joined += raw_of(t.get<std::string>());
  // Every token up to the one holding the stop string, none after it.
  EXPECT_EQ(joined.substr(0, choice["text"].get<std::string>().size()), choice["text"]);
  EXPECT_LE(joined.size(), choice["text"].get<std::string>().size() + 1) << joined;
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());  // logprobs 0: the chosen tokens only
  // Without echo the first entry is the first generated token, with its log-prob.
  EXPECT_FALSE(lp["token_logprobs"][0].is_null());
}

TEST(CompletionLogprobs, AFinalEndOfDocumentIsNotListed) {
  ASSERT_TRUE(fs::exists(kGpt2 / "gpt2-vocab.json")) << "run scripts/get-corpus.sh";
  Gpt2Api api;
  std::vector<int32_t> generated = api.tokenizer.encode(" yes");
  generated.push_back(50256);
  const json body = {{"prompt", "Well"}, {"max_tokens", 5}, {"logprobs", 0}};
  const json out = api.answer(body, generated, FinishReason::Stop);
  EXPECT_EQ(out["choices"][0]["text"], " yes");
  EXPECT_EQ(out["choices"][0]["logprobs"]["tokens"].size(), generated.size() - 1);
}

}  // namespace
}  // namespace megatron::inference
