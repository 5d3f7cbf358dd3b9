// A Llama-style model (RMSNorm, SwiGLU, rotary, grouped-query attention, no biases, untied output
// layer) trained by `megatron pretrain-gpt`, resharded to TP2 x PP2 by `megatron checkpoint
// convert`, and loaded by `generate` and `serve` (--use-checkpoint-args) from both checkpoints:
// the same tokens and bit-identical log-probs, greedy and sampled.
#include <gtest/gtest.h>

#include <cmath>

#include "cli_test_util.h"
#include "serve_process.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

const std::string kLlamaFlags =
    " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --group-query-attention"
    " --num-query-groups 2 --ffn-hidden-size 48 --normalization RMSNorm --swiglu"
    " --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights"
    " --seq-length 32 --max-position-embeddings 32";
const std::string kTokenizer = " --tokenizer-type NullTokenizer --vocab-size 4096";  // mock data needs 4095

TEST(LlamaCheckpointCommands, GenerateAndServeFromTp1AndTp2Pp2CheckpointsAgree) {
  mt::TempDir tmp;
  const fs::path tp1 = tmp / "tp1", tp2pp2 = tmp / "tp2pp2";
  const auto train = mt::run_cli(
      "--log-level warn pretrain-gpt" + kLlamaFlags + kTokenizer +
      " --mock-data --micro-batch-size 4 --global-batch-size 4 --train-iters 6 --lr 1e-2"
      " --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --eval-interval 1000"
      " --log-interval 1000 --save " + tp1.string() + " --save-interval 6");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto convert = mt::run_cli("--log-level warn checkpoint convert --load " + tp1.string() +
                                   " --save " + tp2pp2.string() +
                                   " --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  ASSERT_TRUE(fs::exists(tp2pp2 / "iter_0000006" / "mp_rank_01_001" / "model.safetensors"));

  // generate: two prompts greedy, two sampled with a seed, log-probs of every token.
  auto generate = [&](const fs::path& load, const std::string& sampling) {
    const auto r = mt::run_cli("generate --load " + load.string() + " --use-checkpoint-args" +
                               kTokenizer + " --prompt '1 2 3' --prompt '5 6 7 8 9'"
                               " --num-tokens-to-generate 12 --return-log-probs --output-format jsonl" +
                               sampling);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("4 layers, hidden 32"), std::string::npos) << r.output;
    return testing::json_lines(r.output);
  };
  for (const std::string sampling : {" --top_k 1", " --top_k 0 --temperature 1.5 --random-seed 3"}) {
    SCOPED_TRACE(sampling);
    const auto a = generate(tp1, sampling), b = generate(tp2pp2, sampling);
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(b.size(), 2u);
    for (size_t i = 0; i < a.size(); ++i) {
      const size_t prompt = i == 0 ? 3 : 5;  // at most 12 more (it may stop at the end of document)
      EXPECT_GT(a[i]["tokens"].size(), prompt) << a[i];
      EXPECT_LE(a[i]["tokens"].size(), prompt + 12) << a[i];
      EXPECT_EQ(a[i]["tokens"], b[i]["tokens"]);
      const auto la = a[i]["logprobs"].get<std::vector<float>>(), lb = b[i]["logprobs"].get<std::vector<float>>();
      EXPECT_EQ(la, lb);  // bit for bit
      for (float lp : la) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f) << a[i];
    }
  }

  // serve: PUT /api from both checkpoints, greedy and sampled with a random_seed.
  auto serve = [&](const fs::path& load) {
    testing::ServeProcess server("--load " + load.string() + " --use-checkpoint-args" + kTokenizer,
                                 tmp / (load.filename().string() + "-serve.log"));
    std::vector<json> out;
    EXPECT_GT(server.port(), 0) << server.log();
    if (server.port() == 0) return out;
    for (const char* body :
         {R"({"prompts": ["1 2 3", "5 6 7 8 9"], "tokens_to_generate": 12, "top_k": 1, "logprobs": true})",
          R"({"prompts": ["1 2 3"], "tokens_to_generate": 12, "top_k": 0, "temperature": 1.5,
              "random_seed": 3, "logprobs": true})"}) {
      auto r = server.put_api(body);
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
      if (r && r->status == 200) out.push_back(json::parse(r->body));
    }
    EXPECT_TRUE(server.stop()) << server.log();
    return out;
  };
  const auto s1 = serve(tp1), s2 = serve(tp2pp2);
  ASSERT_EQ(s1.size(), 2u);
  ASSERT_EQ(s2.size(), 2u);
  for (size_t k = 0; k < s1.size(); ++k) {
    EXPECT_EQ(s1[k]["tokens"], s2[k]["tokens"]);
    EXPECT_EQ(s1[k]["logprobs"], s2[k]["logprobs"]);  // JSON numbers: the same floats
    EXPECT_EQ(s1[k]["text"], s2[k]["text"]);
  }
  // The server's greedy answer is generate's.
  const auto g = generate(tp1, " --top_k 1");
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(s1[0]["tokens"][0], g[0]["tokens"]);
  EXPECT_EQ(s1[0]["tokens"][1], g[1]["tokens"]);
}

}  // namespace
}  // namespace megatron::inference
