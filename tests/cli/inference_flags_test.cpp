// The flags of Megatron's run_text_generation_server_345M.sh on `serve` and `generate` (parallel
// sizes 1 or the checkpoint's, --fp16, --micro-batch-size, --seed, the sampling flags), and the
// PUT /api answer's "logprobs": null unless asked for, as Megatron's server answers.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli_fixture.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

using json = nlohmann::json;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The model and tokenizer part of run_text_generation_server_345M.sh, scaled to the fixture.
std::string script_flags(int tp = 1) {
  const auto& f = cli_fixture();
  return " --tensor-model-parallel-size " + std::to_string(tp) +
         " --pipeline-model-parallel-size 1 --num-layers 1"
         " --hidden-size 32 --load " + f.checkpoint + " --num-attention-heads 4"
         " --max-position-embeddings 32 --tokenizer-type GPT2BPETokenizer --fp16"
         " --micro-batch-size 1 --seq-length 32 --vocab-file " + f.vocab_file +
         " --merge-file " + f.merge_file;
}

TEST(ServerScriptFlags, ServeTakesThemAndAnswersLogprobsNullUnlessAsked) {
  TempDir tmp;
  const int port = free_port();
  const std::string log = (tmp / "serve.log").string();
  const std::string cmd = "exec '" + cli_path().string() + "' serve" + script_flags() +
                          " --out-seq-length 1024 --temperature 1.0 --top_p 0.9 --seed 42 --port " +
                          std::to_string(port) + " > '" + log + "' 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  httplib::Client cli("127.0.0.1", port);
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {
    auto r = cli.Get("/health");
    up = r && r->status == 200;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(up) << read_file(log);
  if (up) {
    auto r = cli.Put("/api", R"({"prompts": ["The jury"], "tokens_to_generate": 3, "top_k": 1})",
                     "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json plain = json::parse(r->body);
    ASSERT_TRUE(plain.contains("logprobs")) << r->body;
    EXPECT_TRUE(plain["logprobs"].is_null()) << r->body;
    EXPECT_EQ(plain["text"].size(), 1u);
    r = cli.Put("/api", R"({"prompts": ["The jury"], "tokens_to_generate": 3, "top_k": 1, "logprobs": true})",
                "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json asked = json::parse(r->body);
    ASSERT_TRUE(asked["logprobs"].is_array()) << r->body;
    EXPECT_EQ(asked["logprobs"][0].size(), asked["tokens"][0].size() - 1) << r->body;
    EXPECT_EQ(asked["text"], plain["text"]);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(log);
}

TEST(ServerScriptFlags, GenerateTakesThemToo) {
  auto r = run_cli("--log-level warn generate" + script_flags() +
                   " --seed 42 --prompt 'The jury' --num-tokens-to-generate 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("The jury", 0), 0u) << r.output;
  r = run_cli("generate" + script_flags() + " --bf16 --prompt x");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--fp16 and --bf16 cannot be combined"), std::string::npos) << r.output;
  r = run_cli("generate" + script_flags(2) + " --prompt x");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--tensor-model-parallel-size 2 differs from the checkpoint's (1"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pass 1"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::testing
