// `megatron generate`, `megatron serve` and `megatron client` end to end on a tiny random GPT
// saved as a checkpoint: outputs equal the engine run in-process; mistakes are clear errors.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "inference/generation.h"
#include "test_util.h"
#include "cli_test_util.h"

namespace megatron::inference {
namespace {

namespace mt = megatron::testing;

using testing::Checkpoint;
using testing::kModelFlags;
using testing::without_warnings;

std::vector<int32_t> greedy(const testing::Weights& w, std::vector<int32_t> prompt, int64_t n) {
  GPTEngine model(testing::gpt2_config(), w);
  std::vector<SequenceRequest> rows(1);
  rows[0].prompt = std::move(prompt);
  rows[0].tokens_to_generate = n;
  rows[0].sampling.top_k = 1;
  SpecialTokens special;
  special.eod = 59;
  return generate(model, rows, 60, special)[0].tokens;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

TEST(GenerateCommand, GreedyOutputEqualsTheEngine) {
  Checkpoint ckpt;
  const auto r = mt::run_cli("--log-level warn generate --load " + ckpt.dir.path().string() + kModelFlags +
                             " --prompt '1 2 3' --prompt '7 8' --num-tokens-to-generate 6"
                             " --output-format jsonl --return-log-probs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(without_warnings(r.output));
  std::string line;
  std::vector<nlohmann::json> out;
  while (std::getline(lines, line)) out.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(out.size(), 2u) << r.output;
  const auto want = greedy(ckpt.weights, {1, 2, 3}, 6);
  EXPECT_EQ(out[0]["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(out[0]["text"], join(want));
  EXPECT_EQ(out[0]["logprobs"].size(), want.size() - 1);
  EXPECT_EQ(out[1]["tokens"].get<std::vector<int32_t>>(), greedy(ckpt.weights, {7, 8}, 6));

  // Prompts from standard input, plain text output.
  const auto piped = mt::run_command("printf '1 2 3\\n' | '" + mt::cli_path().string() +
                                     "' --log-level warn generate --load " + ckpt.dir.path().string() +
                                     kModelFlags + " --num-tokens-to-generate 6");
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(without_warnings(piped.output), join(want) + "\n\n");

  const auto beam = mt::run_cli("--log-level warn generate --load " + ckpt.dir.path().string() + kModelFlags +
                                " --prompt '1 2 3' --num-tokens-to-generate 4 --beam-width 2");
  ASSERT_EQ(beam.exit_code, 0) << beam.output;
  EXPECT_NE(beam.output.find("score: "), std::string::npos);
}

TEST(GenerateCommand, MistakesAreClearErrors) {
  Checkpoint ckpt;
  const std::string load = " --load " + ckpt.dir.path().string();
  struct Case {
    std::string args, says;
  };
  mt::TempDir empty;
  const std::vector<Case> cases = {
      {" --load " + empty.path().string() + kModelFlags + " --prompt 1", "latest_checkpointed_iteration.txt"},
      {load + kModelFlags + " --prompt 1 --ckpt-step 9", "iter_0000009"},
      {load + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --max-position-embeddings 32"
              " --tokenizer-type NullTokenizer --vocab-size 200 --prompt 1", "pads to 256"},
      {load + " --num-layers 3 --hidden-size 32 --num-attention-heads 4 --max-position-embeddings 32"
              " --tokenizer-type NullTokenizer --vocab-size 60 --make-vocab-size-divisible-by 64 --prompt 1",
       "decoder.layers.2"},
      {load + kModelFlags + " --prompt '1 2 3' --num-tokens-to-generate 40", "maximum sequence length"},
      {load + kModelFlags + " --prompt 'hello'", "not an integer token id"},
      {load + kModelFlags + " --prompt 1 --top_k 5 --top_p 0.5", "cannot be combined"},
      {load + kModelFlags + " --prompt 1 --num-tokens-to-generate 0", "--return-log-probs"},
  };
  for (const auto& c : cases) {
    const auto r = mt::run_cli("generate" + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(ServeCommand, ServesAnswersTheClientAndStopsOnSigterm) {
  Checkpoint ckpt;
  const int port = free_port();
  const std::string log = (ckpt.dir.path() / "serve.log").string();
  const std::string cmd = "exec '" + mt::cli_path().string() + "' serve --load " +
                          ckpt.dir.path().string() + kModelFlags + " --port " + std::to_string(port) +
                          " > '" + log + "' 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  httplib::Client cli("127.0.0.1", port);
  bool up = false;
  for (int i = 0; i < 200 && !up; ++i) {
    auto r = cli.Get("/health");
    up = r && r->status == 200;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(up) << mt::read_file(log);
  if (up) {
    auto r = cli.Put("/api", R"({"prompts": ["1 2 3"], "tokens_to_generate": 6, "top_k": 1})", "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const auto want = greedy(ckpt.weights, {1, 2, 3}, 6);
    EXPECT_EQ(nlohmann::json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>(), want);
    // The interactive client: the server's default is sampling, so ask for 0 tokens plus an
    // invalid count and check the replies' shape.
    const auto c = mt::run_command("printf '1 2 3\\nabc\\n4 5\\n3\\n' | '" + mt::cli_path().string() +
                                   "' client 127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find("is not a whole number"), std::string::npos) << c.output;
    EXPECT_NE(c.output.find("Megatron Response: \n4 5 "), std::string::npos) << c.output;
    const auto bad = mt::run_command("printf '1\\n99\\n' | '" + mt::cli_path().string() +
                                     "' client 127.0.0.1:" + std::to_string(port));
    EXPECT_NE(bad.output.find("Error 400: "), std::string::npos) << bad.output;
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << mt::read_file(log);
}

TEST(ServeCommand, PublicHostWithoutKeyIsRefused) {
  const auto r = mt::run_cli("serve --load /nonexistent" + kModelFlags + " --host 0.0.0.0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--api-key"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::inference
