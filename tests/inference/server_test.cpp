// The HTTP server end to end, in-process on a free loopback port, driven by httplib::Client:
// both APIs (results checked against the engine run directly), streaming, every class of bad
// request, the API key, a full queue, and concurrent load.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <future>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "fake_model.h"
#include "inference/server.h"
#include "running_server.h"
#include "inference/server_api.h"

namespace megatron::inference {
namespace {

using nlohmann::json;
using testing::FakeModel;
using testing::LogitsFn;

constexpr int64_t kVocab = 100;   // NullTokenizer: ids 0..99, EOD 99
constexpr int64_t kWidth = 128;   // padded logits
constexpr int64_t kContext = 64;

using testing::RunningServer;

ServerOptions small_options() {
  ServerOptions o;
  o.max_request_bytes = 4096;
  o.max_tokens_to_generate = 32;
  o.max_batch_size = 8;
  return o;
}

// The engine's greedy answer for a prompt, computed without the server.
std::vector<int32_t> expected_greedy(std::vector<int32_t> prompt, int64_t n) {
  FakeModel model(kWidth, kContext);
  SequenceRequest r;
  r.prompt = std::move(prompt);
  r.tokens_to_generate = n;
  r.sampling.top_k = 1;
  std::vector<SequenceRequest> rows = {r};
  SpecialTokens special;
  special.eod = int32_t(kVocab - 1);
  return generate(model, rows, kVocab, special)[0].tokens;
}

std::string join(const std::vector<int32_t>& ids, size_t from = 0) {
  std::string s;
  for (size_t i = from; i < ids.size(); ++i) s += (i > from ? " " : "") + std::to_string(ids[i]);
  return s;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RunningServer(small_options()); }
  static void TearDownTestSuite() { delete server_; }
  static RunningServer* server_;
};
RunningServer* ServerTest::server_ = nullptr;

TEST_F(ServerTest, Health) {
  auto r = server_->client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");
}

TEST_F(ServerTest, MegatronApiGreedyMatchesTheEngine) {
  auto r = server_->client().Put(
      "/api", R"({"prompts": ["1 2 3", "7"], "tokens_to_generate": 6, "top_k": 1, "logprobs": true})",
      "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const auto want0 = expected_greedy({1, 2, 3}, 6), want1 = expected_greedy({7}, 6);
  EXPECT_EQ(j["tokens"][0].get<std::vector<int32_t>>(), want0);
  EXPECT_EQ(j["tokens"][1].get<std::vector<int32_t>>(), want1);
  EXPECT_EQ(j["text"][0], join(want0));
  EXPECT_EQ(j["segments"][0].size(), want0.size());
  EXPECT_EQ(j["segments"][0][1], "2");
  EXPECT_EQ(j["logprobs"][0].size(), want0.size() - 1);
  EXPECT_EQ(j["logprobs"][1].size(), want1.size() - 1);
}

TEST_F(ServerTest, MegatronApiScoringBeamAndSeeds) {
  auto c = server_->client();
  auto r = c.Put("/api", R"({"prompts": ["4 5 6"], "tokens_to_generate": 0, "logprobs": true})",
                 "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["logprobs"][0].size(), 2u);
  r = c.Put("/api", R"({"prompts": ["4 5 6"], "tokens_to_generate": 5, "beam_width": 3})",
            "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["scores"].size(), 3u);
  EXPECT_EQ(j["text"].size(), 3u);
  EXPECT_GE(j["scores"][0].get<double>(), j["scores"][2].get<double>());
  const std::string sampled = R"({"prompts": ["1"], "tokens_to_generate": 8, "random_seed": 5, "top_p": 0.9})";
  const auto a = json::parse(c.Put("/api", sampled, "application/json")->body);
  const auto b = json::parse(c.Put("/api", sampled, "application/json")->body);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  r = c.Put("/api", R"({"prompts": [""], "add_BOS": true, "tokens_to_generate": 2})", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["tokens"][0][0], kVocab - 1);
}

TEST_F(ServerTest, CompletionsGreedyEchoLogprobsAndStop) {
  auto c = server_->client();
  const auto want = expected_greedy({3, 1, 4}, 5);
  auto r = c.Post("/v1/completions", R"({"prompt": "3 1 4", "max_tokens": 5, "temperature": 0})",
                  "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  std::vector<int32_t> gen(want.begin() + 3, want.end());
  if (!gen.empty() && gen.back() == kVocab - 1) gen.pop_back();
  EXPECT_EQ(j["choices"][0]["text"], join(gen));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 3 + int(want.size()) - 3);

  r = c.Post("/v1/completions",
             R"({"prompt": [[3, 1, 4]], "max_tokens": 5, "temperature": 0, "echo": true, "logprobs": 2})",
             "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  const auto& lp = j["choices"][0]["logprobs"];
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(lp["tokens"].size(), 3 + gen.size());
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], "3 1 4" + join(gen));

  // Stop at the text of the third generated token: the completion is cut before it.
  ASSERT_GE(gen.size(), 3u);
  const std::string stop = " " + std::to_string(gen[2]);
  r = c.Post("/v1/completions",
             json{{"prompt", "3 1 4"}, {"max_tokens", 5}, {"temperature", 0}, {"stop", {stop}}}.dump(),
             "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  const std::string full = join(gen);
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  r = c.Post("/v1/completions", R"({"prompt": ["1", "2"], "max_tokens": 3, "n": 2, "seed": 3})",
             "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"].size(), 4u);
}

TEST_F(ServerTest, CompletionsStreamAsServerSentEvents) {
  auto c = server_->client();
  const std::string req = R"({"prompt": "8 8", "max_tokens": 7, "temperature": 0.7, "seed": 11)";
  auto plain = c.Post("/v1/completions", req + "}", "application/json");
  ASSERT_EQ(plain->status, 200) << plain->body;
  auto r = c.Post("/v1/completions", req + R"(, "stream": true})", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::string text, finish;
  size_t pos = 0, events = 0;
  bool done = false;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string data = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    ++events;
    if (data == "[DONE]") {
      done = true;
      break;
    }
    const auto j = json::parse(data);
    text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_GE(events, 3u);
  EXPECT_EQ(text, json::parse(plain->body)["choices"][0]["text"]);
  EXPECT_FALSE(finish.empty());
}

// Server-sent events of a streamed completion: the concatenated text and the finish reasons.
std::pair<std::string, std::vector<std::string>> read_stream(const std::string& body, bool* done) {
  std::string text;
  std::vector<std::string> finish;
  size_t pos = 0;
  *done = false;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      *done = true;
      break;
    }
    const auto j = json::parse(data);
    text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finish.push_back(j["choices"][0]["finish_reason"]);
  }
  return {text, finish};
}

TEST_F(ServerTest, StreamingHonoursStopStringsAndEcho) {
  auto c = server_->client();
  const auto want = expected_greedy({5, 6}, 8);
  std::vector<int32_t> gen(want.begin() + 2, want.end());
  if (!gen.empty() && gen.back() == kVocab - 1) gen.pop_back();
  ASSERT_GE(gen.size(), 4u);
  const std::string full = join(gen), stop = " " + std::to_string(gen[3]);
  json req = {{"prompt", "5 6"}, {"max_tokens", 8}, {"temperature", 0}, {"stop", stop},
              {"stream", true}, {"echo", true}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  bool done = false;
  const auto [text, finish] = read_stream(r->body, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(text, "5 6" + full.substr(0, full.find(stop)));
  ASSERT_EQ(finish.size(), 1u);
  EXPECT_EQ(finish[0], "stop");
}

struct BadRequest {
  const char* method;
  const char* path;
  std::string body;
  int status;
  const char* says;  // a substring of the error message
};

TEST_F(ServerTest, EveryBadRequestGetsAClearJsonError) {
  const std::vector<BadRequest> cases = {
      {"PUT", "/api", "{", 400, "invalid JSON"},
      {"PUT", "/api", "", 400, "empty"},
      {"PUT", "/api", std::string(100, '[') + std::string(100, ']'), 400, "nested"},
      {"PUT", "/api", "[]", 400, "JSON object"},
      {"PUT", "/api", R"({"prompts": ["1"], "bogus": 1})", 400, "unknown field \"bogus\""},
      {"PUT", "/api", R"({"tokens_to_generate": 3})", 400, "prompts argument required"},
      {"PUT", "/api", R"({"prompts": "1 2"})", 400, "list of strings"},
      {"PUT", "/api", R"({"prompts": []})", 400, "empty"},
      {"PUT", "/api", R"({"prompts": [1]})", 400, "list of strings"},
      {"PUT", "/api", json{{"prompts", std::vector<std::string>(129, "1")}}.dump(), 400, "Maximum number of prompts"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": -1})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": "5"})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": 3.5})", 400, "integer"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": 18446744073709551615})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": 1e300})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": 33})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": true})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"prompts": ["1"], "tokens_to_generate": 0})", 400, "logprobs"},
      {"PUT", "/api", R"({"prompts": ["1"], "logprobs": "yes"})", 400, "logprobs must be true or false"},
      {"PUT", "/api", R"({"prompts": ["1"], "temperature": 0})", 400, "temperature"},
      {"PUT", "/api", R"({"prompts": ["1"], "temperature": 101})", 400, "temperature"},
      {"PUT", "/api", R"({"prompts": ["1"], "top_k": 1001})", 400, "top_k"},
      {"PUT", "/api", R"({"prompts": ["1"], "top_p": 1.5})", 400, "top_p"},
      {"PUT", "/api", R"({"prompts": ["1"], "top_p": 0.5, "top_k": 5})", 400, "both"},
      {"PUT", "/api", R"({"prompts": ["1"], "top_p_decay": 0.5})", 400, "without top_p"},
      {"PUT", "/api", R"({"prompts": ["1"], "top_p": 0.5, "top_p_bound": 0.6})", 400, "top_p_bound"},
      {"PUT", "/api", R"({"prompts": [""]})", 400, "add_BOS"},
      {"PUT", "/api", R"({"prompts": ["  "]})", 400, "add_BOS"},
      {"PUT", "/api", R"({"prompts": ["hello"]})", 400, "cannot be tokenized"},
      {"PUT", "/api", R"({"prompts": ["100"]})", 400, "cannot be tokenized"},
      {"PUT", "/api", R"({"max_len": 5, "prompts": ["1"]})", 400, "tokens_to_generate"},
      {"PUT", "/api", R"({"sentences": ["1"]})", 400, "prompts"},
      {"PUT", "/api", json{{"prompts", {join(std::vector<int32_t>(60, 5))}}, {"tokens_to_generate", 10}}.dump(), 400, "maximum sequence length"},
      {"PUT", "/api", R"({"prompts": ["1", "2"], "beam_width": 2, "tokens_to_generate": 2})", 400, "exactly one prompt"},
      {"PUT", "/api", R"({"prompts": ["1"], "beam_width": 0, "tokens_to_generate": 2})", 400, "beam_width"},
      {"PUT", "/api", R"({"prompts": ["1"], "beam_width": 17, "tokens_to_generate": 2})", 400, "beam_width"},
      {"PUT", "/api", R"({"prompts": ["1"], "stop_token": 3, "tokens_to_generate": 2})", 400, "beam_width"},
      {"PUT", "/api", R"({"prompts": ["1"], "random_seed": -5})", 400, "random_seed"},
      {"POST", "/v1/completions", R"({"max_tokens": 3})", 400, "prompt is required"},
      {"POST", "/v1/completions", R"({"prompt": 5})", 400, "prompt"},
      {"POST", "/v1/completions", R"({"prompt": []})", 400, "prompt"},
      {"POST", "/v1/completions", R"({"prompt": [[1, "a"]]})", 400, "token ids"},
      {"POST", "/v1/completions", R"({"prompt": [1, 100]})", 400, "token ids"},
      {"POST", "/v1/completions", R"({"prompt": ["1", 2]})", 400, "not a mix"},
      {"POST", "/v1/completions", R"({"prompt": "1", "max_tokens": -1})", 400, "max_tokens"},
      {"POST", "/v1/completions", R"({"prompt": "1", "n": 0})", 400, "n must"},
      {"POST", "/v1/completions", R"({"prompt": "1", "n": 100})", 400, "n must"},
      {"POST", "/v1/completions", R"({"prompt": "1", "stop": 5})", 400, "stop"},
      {"POST", "/v1/completions", R"({"prompt": "1", "stop": [""]})", 400, "stop"},
      {"POST", "/v1/completions", R"({"prompt": "1", "logprobs": true})", 400, "logprobs"},
      {"POST", "/v1/completions", R"({"prompt": "1", "logprobs": 11})", 400, "logprobs"},
      {"POST", "/v1/completions", R"({"prompt": "1", "logprobs": 1, "stream": true})", 400, "stream"},
      {"POST", "/v1/completions", R"({"prompt": "1", "presence_penalty": 1})", 400, "not supported"},
      {"POST", "/v1/completions", R"({"prompt": "1", "suffix": "x"})", 400, "not supported"},
      {"POST", "/v1/completions", R"({"prompt": "1", "temperature": -1})", 400, "temperature"},
      {"POST", "/v1/completions", R"({"prompt": "1", "top_p": 0})", 400, "top_p"},
      {"POST", "/v1/completions", R"({"prompt": "1", "frobnicate": 0})", 400, "unknown field"},
      {"POST", "/v1/completions", R"({"prompt": "1", "max_tokens": 64})", 400, "max_tokens"},
      {"GET", "/nope", "", 404, "no endpoint"},
      {"GET", "/api", "", 405, "PUT"},
      {"PUT", "/v1/completions", "{}", 405, "POST"},
      {"POST", "/api", "{}", 405, "PUT"},
      {"PUT", "/api", std::string(5000, ' '), 413, "larger than"},
  };
  auto c = server_->client();
  for (const auto& bad : cases) {
    httplib::Result r{nullptr, httplib::Error::Unknown};
    const std::string m = bad.method;
    if (m == "GET") r = c.Get(bad.path);
    else if (m == "PUT") r = c.Put(bad.path, bad.body, "application/json");
    else r = c.Post(bad.path, bad.body, "application/json");
    ASSERT_TRUE(r) << bad.body;
    EXPECT_EQ(r->status, bad.status) << m << " " << bad.path << " " << bad.body << " -> " << r->body;
    json j;
    ASSERT_NO_THROW(j = json::parse(r->body)) << r->body;
    ASSERT_TRUE(j.contains("error") && j["error"].is_string()) << r->body;
    EXPECT_NE(j["error"].get<std::string>().find(bad.says), std::string::npos)
        << bad.body << " -> " << j["error"];
  }
  // Still serving after all of that.
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(ServerAuth, ApiKeyIsCheckedOnEveryRequest) {
  ServerOptions o = small_options();
  o.api_key = "s3cret";
  RunningServer s(o);
  auto c = s.client();
  EXPECT_EQ(c.Get("/health")->status, 401);
  auto r = c.Put("/api", R"({"prompts": ["1"]})", "application/json");
  EXPECT_EQ(r->status, 401);
  EXPECT_NE(json::parse(r->body)["error"].get<std::string>().find("Bearer"), std::string::npos);
  c.set_bearer_token_auth("wrong");
  EXPECT_EQ(c.Get("/health")->status, 401);
  c.set_bearer_token_auth("s3cret");
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Put("/api", R"({"prompts": ["1"], "tokens_to_generate": 2})", "application/json")->status, 200);
}

TEST(ServerAuth, PublicHostRequiresAnApiKey) {
  FakeModel model(kWidth, kContext);
  data::NullTokenizer tok(kVocab);
  ServerOptions o;
  o.host = "0.0.0.0";
  EXPECT_THROW(TextGenerationServer(model, tok, o), Error);
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
}

TEST(ServerLoad, FullQueueAnswers503AndRecovers) {
  ServerOptions o = small_options();
  o.max_queue_size = 1;
  o.max_batch_size = 1;
  RunningServer s(o, [](std::span<const int32_t> p, std::span<float> l) {
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    testing::hashed_logits(p, l);
  });
  std::vector<std::future<int>> results;
  for (int i = 0; i < 8; ++i)
    results.push_back(std::async(std::launch::async, [&s] {
      auto r = s.client().Put("/api", R"({"prompts": ["1"], "tokens_to_generate": 10})", "application/json");
      if (!r) return -1;
      if (r->status == 503) {
        EXPECT_NE(r->body.find("busy"), std::string::npos);
      }
      return r->status;
    }));
  int ok = 0, busy = 0;
  for (auto& f : results) {
    const int status = f.get();
    ok += status == 200;
    busy += status == 503;
  }
  EXPECT_EQ(ok + busy, 8);
  EXPECT_GE(ok, 1);
  EXPECT_GE(busy, 1);
  EXPECT_EQ(s.client().Put("/api", R"({"prompts": ["1"], "tokens_to_generate": 1})", "application/json")->status, 200);
}

// Continuous batching through HTTP: a short request sent while a long one is generating is
// admitted into the running batch and answered first. Margins are wide: the long request takes
// at least 30 steps of >= 20 ms; the short one needs a prefill and at most one step of waiting.
TEST(ServerLoad, AShortRequestSentDuringALongOneFinishesFirst) {
  ServerOptions o = small_options();
  RunningServer s(o, [](std::span<const int32_t> p, std::span<float> l) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    testing::hashed_logits(p, l);
  });
  // A prompt whose greedy continuation does not reach EOD within 30 tokens.
  std::vector<int32_t> long_prompt, long_want;
  for (int32_t k = 1; k < 99 && long_want.size() != 32; ++k) {
    long_prompt = {k, 1};
    long_want = expected_greedy(long_prompt, 30);
  }
  ASSERT_EQ(long_want.size(), 32u);
  using Clock = std::chrono::steady_clock;
  Clock::time_point long_end, short_end;
  auto long_request = std::async(std::launch::async, [&] {
    auto r = s.client().Put("/api", json{{"prompts", {join(long_prompt)}}, {"tokens_to_generate", 30}, {"top_k", 1}}.dump(), "application/json");
    long_end = Clock::now();
    return r ? json::parse(r->body) : json();
  });
  // Wait until the long request is in the running batch.
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto h = s.client().Get("/health");
    ASSERT_TRUE(h);
    if (json::parse(h->body)["running"].get<int>() >= 1) break;
    ASSERT_LT(Clock::now(), give_up) << "the long request never started";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto r = s.client().Put("/api", R"({"prompts": ["5 6"], "tokens_to_generate": 1, "top_k": 1})", "application/json");
  short_end = Clock::now();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>(), expected_greedy({5, 6}, 1));
  // Answered while the long request is still generating.
  EXPECT_EQ(long_request.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  const json long_body = long_request.get();
  ASSERT_TRUE(long_body.contains("tokens")) << long_body.dump();
  EXPECT_EQ(long_body["tokens"][0].get<std::vector<int32_t>>(), long_want);
  EXPECT_LT(short_end, long_end);
}

TEST(ServerLoad, ThirtyTwoClientsTwentyRequestsEach) {
  ServerOptions o = small_options();
  o.max_queue_size = 64;
  RunningServer s(o);
  // Expected greedy answers for a few prompts, computed by the engine directly.
  std::vector<std::vector<int32_t>> prompts = {{1}, {2, 3}, {4, 5, 6}, {7, 8, 9, 10}, {11, 12}};
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(expected_greedy(p, 6));
  std::atomic<int> failures{0}, checked{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 32; ++c)
    clients.emplace_back([&, c] {
      auto cli = s.client();
      for (int i = 0; i < 20; ++i) {
        const size_t k = size_t(c + i) % prompts.size();
        if ((c + i) % 2 == 0) {
          auto r = cli.Put("/api", json{{"prompts", {join(prompts[k])}}, {"tokens_to_generate", 6}, {"top_k", 1}}.dump(), "application/json");
          if (!r || r->status != 200 || json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>() != want[k]) {
            ++failures;
            ADD_FAILURE() << (r ? r->body : httplib::to_string(r.error()));
          }
        } else {
          auto r = cli.Post("/v1/completions", json{{"prompt", prompts[k]}, {"max_tokens", 6}, {"temperature", 0}}.dump(), "application/json");
          auto gen = std::vector<int32_t>(want[k].begin() + long(prompts[k].size()), want[k].end());
          if (!gen.empty() && gen.back() == kVocab - 1) gen.pop_back();
          if (!r || r->status != 200 || json::parse(r->body)["choices"][0]["text"] != join(gen)) {
            ++failures;
            ADD_FAILURE() << (r ? r->body : httplib::to_string(r.error()));
          }
        }
        ++checked;
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(checked.load(), 640);
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace megatron::inference
