// A mixture-of-experts GPT (sigmoid routing with the aux-loss-free expert bias, a gated shared
// expert, a capacity factor in training) trained by `megatron pretrain-gpt` runs under
// `generate`, `serve` and `evaluate` (--use-checkpoint-args): the settings and the expert biases
// come from the checkpoint, the server answers as generate does, and evaluation scores the text.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "cli_test_util.h"
#include "serve_process.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

const std::string kTokenizer = " --tokenizer-type NullTokenizer --vocab-size 4096";

TEST(MoeCheckpointCommands, GenerateServeAndEvaluateRunAnMoeCheckpoint) {
  mt::TempDir tmp;
  const fs::path ckpt = tmp / "moe";
  const auto train = mt::run_cli(
      "--log-level warn pretrain-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4"
      " --ffn-hidden-size 48 --swiglu --disable-bias-linear --seq-length 32"
      " --max-position-embeddings 32 --num-experts 4 --moe-layer-freq '[0,1]'"
      " --moe-ffn-hidden-size 24 --moe-router-topk 2 --moe-router-score-function sigmoid"
      " --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01"
      " --moe-shared-expert-intermediate-size 16 --moe-shared-expert-gate"
      " --moe-expert-capacity-factor 1.5 --moe-aux-loss-coeff 0.01" + kTokenizer +
      " --mock-data --micro-batch-size 4 --global-batch-size 4 --train-iters 6 --lr 1e-2"
      " --eval-iters 0 --eval-interval 1000 --log-interval 1000 --save " + ckpt.string() +
      " --save-interval 6");
  ASSERT_EQ(train.exit_code, 0) << train.output;

  const auto gen = mt::run_cli("generate --load " + ckpt.string() + " --use-checkpoint-args" +
                               kTokenizer + " --prompt '1 2 3' --prompt '5 6 7 8 9'"
                               " --num-tokens-to-generate 8 --return-log-probs --output-format jsonl"
                               " --top_k 1");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const std::vector<json> rows = testing::json_lines(gen.output);
  ASSERT_EQ(rows.size(), 2u) << gen.output;
  for (const json& r : rows) {
    EXPECT_GT(r["tokens"].size(), 3u) << r;
    for (float lp : r["logprobs"].get<std::vector<float>>()) EXPECT_TRUE(std::isfinite(lp) && lp <= 0) << r;
  }

  testing::ServeProcess server("--load " + ckpt.string() + " --use-checkpoint-args" + kTokenizer,
                               tmp / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  const auto r = server.put_api(R"({"prompts": ["1 2 3"], "tokens_to_generate": 8, "top_k": 1})");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  const json answer = json::parse(r->body);
  EXPECT_EQ(answer["tokens"][0], rows[0]["tokens"]) << r->body;
  server.stop();

  std::string text;
  for (int i = 0; i < 120; ++i) text += std::to_string((i * 37 + 11) % 60) + " ";
  const fs::path data = tmp / "wiki.test.tokens";
  mt::write_file(data, text + "\n");
  const auto eval = mt::run_cli("evaluate --load " + ckpt.string() + " --use-checkpoint-args" +
                                kTokenizer + " --task WIKITEXT103 --valid-data " + data.string() +
                                " --overlapping-eval 16 --micro-batch-size 2");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(eval.output, m, std::regex(R"(loss sum (\S+) nats)"))) << eval.output;
  EXPECT_TRUE(std::isfinite(std::stod(m[1].str())) && std::stod(m[1].str()) > 0) << eval.output;
}

}  // namespace
}  // namespace megatron::inference
