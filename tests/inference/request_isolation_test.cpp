// One request cannot fail or starve its neighbours: a sequence whose logits turn non-finite fails
// alone in the continuous-batching engine and in the server's running batch (a clean request
// batched with it gets its exact answer); sampling settings a float cannot hold (temperature
// 1e-40, 1e-320) are 400s naming the limits on both APIs; and a burst of 64 concurrent 1 MiB
// bodies leaves the server's resident memory near where it started.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "fake_model.h"
#include "inference/batch_engine.h"
#include "inference/generation.h"
#include "inference/server.h"
#include "running_server.h"
#include "test_util.h"

namespace megatron::inference {
namespace {

using nlohmann::json;
using testing::FakeModel;

constexpr int64_t kVocab = 100;  // NullTokenizer: ids 0..99, EOD 99
constexpr int64_t kWidth = 128;
constexpr int64_t kContext = 64;
constexpr int32_t kPoison = 7;  // a prompt starting with it gets NaN logits from its 2nd token on

void poisoned_logits(std::span<const int32_t> prefix, std::span<float> logits) {
  testing::hashed_logits(prefix, logits);
  if (prefix[0] == kPoison && prefix.size() >= 3)
    logits[5] = std::numeric_limits<float>::quiet_NaN();
}

SpecialTokens special() {
  SpecialTokens s;
  s.eod = int32_t(kVocab - 1);
  return s;
}

SequenceRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  SequenceRequest r;
  r.prompt = std::move(prompt);
  r.tokens_to_generate = n;
  r.sampling.top_k = 1;
  r.stop_on_eod = false;
  return r;
}

std::vector<int32_t> alone(const SequenceRequest& r) {
  FakeModel model(kWidth, kContext);
  std::vector<SequenceRequest> rows = {r};
  return generate(model, rows, kVocab, special())[0].tokens;
}

TEST(RequestIsolation, AFailingSequenceEndsAloneInTheBatchEngine) {
  FakeModel model(kWidth, kContext, poisoned_logits);
  BatchEngine engine(model, kVocab, special(), 4);
  const SequenceRequest clean = greedy({5, 6}, 6), poisoned = greedy({kPoison, 1}, 6);
  SequenceRequest sampled = greedy({9, 9, 9}, 5);
  sampled.sampling.top_k = 0;
  sampled.sampling.temperature = 0.7f;
  sampled.seed = 3;
  engine.admit(clean, 0);
  engine.admit(poisoned, 1);
  engine.admit(sampled, 2);
  std::map<uint64_t, SequenceResult> done;
  for (int step = 0; step < 20 && !engine.idle(); ++step)
    for (auto& f : engine.step()) done[f.id] = std::move(f.result);
  ASSERT_TRUE(engine.idle());
  ASSERT_EQ(done.size(), 3u);
  EXPECT_NE(done[1].error.find("logits are not finite (nan for token 5)"), std::string::npos)
      << done[1].error;
  EXPECT_EQ(done[1].tokens.size(), 3u);  // the token chosen before the failure is kept
  EXPECT_EQ(done[0].error, "");
  EXPECT_EQ(done[0].tokens, alone(clean));
  EXPECT_EQ(done[2].error, "");
  EXPECT_EQ(done[2].tokens, alone(sampled));
  EXPECT_EQ(engine.free_slots(), 4);
}

using testing::RunningServer;

// The poisoned request and a clean one are batched together (the batch window admits both
// before the first step): the poisoned one is a 500 naming its failure, the clean one gets
// exactly what it gets alone, and the server goes on serving.
TEST(RequestIsolation, APoisonedRequestFailsAloneInTheServersBatch) {
  ServerOptions o;
  o.max_tokens_to_generate = 32;
  o.max_batch_size = 8;
  o.batch_window_ms = 500;
  RunningServer s(o, poisoned_logits);
  auto put = [&](const json& body) {
    return std::async(std::launch::async, [&s, body] {
      auto r = s.client().Put("/api", body.dump(), "application/json");
      return r ? std::make_pair(r->status, r->body) : std::make_pair(0, std::string());
    });
  };
  auto poisoned = put({{"prompts", {"7 1"}}, {"tokens_to_generate", 6}, {"top_k", 1}});
  auto clean = put({{"prompts", {"5 6"}}, {"tokens_to_generate", 6}, {"top_k", 1}});
  const auto [bad_status, bad_body] = poisoned.get();
  const auto [good_status, good_body] = clean.get();
  EXPECT_EQ(bad_status, 500) << bad_body;
  const std::string error = json::parse(bad_body).value("error", "");
  EXPECT_NE(error.find("generation failed for prompt 0"), std::string::npos) << error;
  EXPECT_NE(error.find("logits are not finite"), std::string::npos) << error;
  ASSERT_EQ(good_status, 200) << good_body;
  SequenceRequest want = greedy({5, 6}, 6);
  want.stop_on_eod = true;
  EXPECT_EQ(json::parse(good_body)["tokens"][0].get<std::vector<int32_t>>(), alone(want));
  // Both rode in the same forwards: the prefill and the decode step where the poisoned row failed.
  ASSERT_GE(s.model.batch_sizes.size(), 2u);
  EXPECT_EQ(s.model.batch_sizes[0], 2);
  EXPECT_EQ(s.model.batch_sizes[1], 2);
  auto again = s.client().Put("/api", R"({"prompts": ["5 6"], "tokens_to_generate": 2, "top_k": 1})",
                              "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
}

// Temperatures a float cannot hold are refused at the edge, naming the range, on both APIs; the
// smallest accepted one samples (the largest logit).
TEST(RequestIsolation, UnrepresentableTemperaturesAre400sNamingTheLimits) {
  ServerOptions o;
  o.max_tokens_to_generate = 8;
  RunningServer s(o);
  auto c = s.client();
  for (const char* t : {"1e-40", "1e-320", "0", "-1", "100.5"}) {
    auto r = c.Put("/api", std::string(R"({"prompts": ["5 6"], "tokens_to_generate": 1, "temperature": )") +
                               t + "}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << t << " " << r->body;
    EXPECT_NE(r->body.find("temperature must be a number in [1.17549e-38, 100]"), std::string::npos)
        << t << " " << r->body;
  }
  for (const char* t : {"1e-40", "1e-320"}) {
    auto r = c.Post("/v1/completions", std::string(R"({"prompt": "5 6", "max_tokens": 1, "temperature": )") +
                                           t + "}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << t << " " << r->body;
    EXPECT_NE(r->body.find("must be 0 (greedy decoding) or a number in [1.17549e-38, 100]"),
              std::string::npos) << t << " " << r->body;
  }
  auto r = c.Put("/api", R"({"prompts": ["5 6"], "tokens_to_generate": 3, "temperature": 1.2e-38})",
                 "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  SequenceRequest want = greedy({5, 6}, 3);
  want.stop_on_eod = true;
  EXPECT_EQ(json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>(), alone(want));
}

// The command line checks the same ranges before loading anything: exit 1 with the flag's name,
// not an internal error (exit 70) at the first sampled token.
TEST(RequestIsolation, GenerateRefusesSettingsOutsideTheirRanges) {
  for (const auto& [flags, says] :
       {std::pair{"--temperature 1e-40", "--temperature must be a number in [1.17549e-38, 100], got 9.99995e-41"},
        std::pair{"--temperature nan", "--temperature must be a number in [1.17549e-38, 100], got nan"},
        std::pair{"--top_k 0 --top_p 1.5", "--top_p must be a number in [0, 1], got 1.5"},
        std::pair{"--top_k 0 --top_p 0.5 --top-p-bound 0.7", "--top-p-bound (0.7) must not exceed --top_p (0.5)"},
        std::pair{"--beam-width 2 --length-penalty inf", "--length-penalty must be a finite number"}}) {
    // Checked before --load is read: no checkpoint is needed to see the error.
    const auto r = ::megatron::testing::run_cli(
        std::string("generate --load /nonexistent --tokenizer-type NullTokenizer --vocab-size 64 "
                    "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
                    "--max-position-embeddings 16 --prompt '1 2' ") + flags);
    EXPECT_EQ(r.exit_code, 1) << flags << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << flags << ": " << r.output;
  }
}

// The resident and peak resident bytes of process `pid` (/proc/PID/status: VmRSS, VmHWM).
std::pair<int64_t, int64_t> rss_and_peak(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  int64_t rss = 0, peak = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) peak = std::stoll(line.substr(6)) * 1024;
  }
  return {rss, peak};
}

// 64 clients send a 1 MiB body at once (each a valid JSON document of small objects, the
// costliest to parse; each is then refused for its unknown field) to a server in a child
// process: the documents are parsed a few at a time, so the peak stays far below 64 parses'
// worth, and the memory is given back after the burst.
TEST(RequestIsolation, ABurstOfLargeBodiesLeavesResidentMemoryNearItsBaseline) {
  int ports[2];
  ASSERT_EQ(::pipe(ports), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the server: serves until killed
    ServerOptions o;
    o.max_request_bytes = 2 << 20;
    o.http_threads = 64;
    RunningServer s(o);
    const int port = s.port;
    if (::write(ports[1], &port, sizeof port) != sizeof port) _exit(1);
    for (;;) ::pause();
  }
  int port = 0;
  ASSERT_EQ(::read(ports[0], &port, sizeof port), ssize_t(sizeof port));
  const auto client = [port] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  };
  std::string body = R"({"prompts": ["1"], "padding": [)";
  while (body.size() < (1u << 20) - 8) body += "{},";
  body += "{}]}";
  // One request first (the server's threads and buffers exist), then the baseline.
  auto warm = client().Put("/api", body, "application/json");
  ASSERT_TRUE(warm);
  ASSERT_EQ(warm->status, 400) << warm->body;
  const auto [baseline, peak_before] = rss_and_peak(child);
  std::vector<std::future<int>> clients;
  for (int k = 0; k < 64; ++k)
    clients.push_back(std::async(std::launch::async, [&] {
      auto r = client().Put("/api", body, "application/json");
      return r ? r->status : 0;
    }));
  for (auto& c : clients) EXPECT_EQ(c.get(), 400);
  EXPECT_EQ(client().Get("/health")->status, 200);
  const auto [after, peak] = rss_and_peak(child);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const double mb = 1e6;
  std::printf("server RSS: baseline %.0f MB, peak %.0f MB (before the burst %.0f MB), after %.0f MB\n",
              double(baseline) / mb, double(peak) / mb, double(peak_before) / mb, double(after) / mb);
  // 64 documents of ~30 MB each at once would be ~2 GB; the 64 bodies themselves are 64 MiB.
  EXPECT_LT(peak - baseline, int64_t(500e6));
  EXPECT_LT(after - baseline, int64_t(100e6));
}

}  // namespace
}  // namespace megatron::inference
