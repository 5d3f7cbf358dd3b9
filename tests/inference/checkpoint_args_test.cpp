// `megatron generate/serve --use-checkpoint-args`: the model shape comes from the checkpoint's
// metadata.json "args" (flat or nested under "model", our keys or Megatron's); flags that
// contradict it, missing keys and missing metadata are clear errors. Also end to end on a
// checkpoint written by `megatron pretrain-gpt --save`.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "data/indexed_dataset.h"
#include "inference/checkpoint_args.h"
#include "inference/generation.h"
#include "test_util.h"
#include "tiny_gpt.h"

namespace megatron::inference {
namespace {

namespace mt = megatron::testing;
using nlohmann::json;

const std::string kTokenizer = " --tokenizer-type NullTokenizer --vocab-size 60 --make-vocab-size-divisible-by 64";

struct Checkpoint {
  Checkpoint(const model::TransformerConfig& config, const json& args) : weights(testing::random_weights(config)) {
    testing::write_checkpoint(dir.path(), weights, 5);
    if (!args.is_null()) set_args(args);
  }
  void set_args(const json& args) const {
    const json meta = {{"format_version", 1}, {"iteration", 5}, {"args", args}};
    mt::write_file(dir.path() / "iter_0000005" / "metadata.json", meta.dump(2));
  }
  mt::TempDir dir;
  testing::Weights weights;
};

// What the trainer writes for the tiny GPT-2 style model (flat keys).
json gpt2_args() {
  return {{"num_layers", 2},         {"hidden_size", 32},
          {"num_attention_heads", 4}, {"ffn_hidden_size", 128},
          {"seq_length", 32},         {"max_position_embeddings", 32},
          {"padded_vocab_size", 64}};
}

std::vector<int32_t> greedy(const model::TransformerConfig& config, const testing::Weights& w,
                            std::vector<int32_t> prompt, int64_t n) {
  GPTEngine model(config, w);
  std::vector<SequenceRequest> rows(1);
  rows[0].prompt = std::move(prompt);
  rows[0].tokens_to_generate = n;
  rows[0].sampling.top_k = 1;
  SpecialTokens special;
  special.eod = 59;
  return generate(model, rows, 60, special)[0].tokens;
}

// Runs generate on prompt "1 2 3" (6 greedy tokens); the tokens, or the run's output on failure.
mt::CommandResult generate_cli(const Checkpoint& ckpt, const std::string& flags) {
  return mt::run_cli("--log-level warn generate --load " + ckpt.dir.path().string() + flags +
                     " --prompt '1 2 3' --num-tokens-to-generate 6 --output-format jsonl");
}

// The tokens of the JSONL line. These hand-made checkpoints record no checksums, which the
// loader says in a warning line before it.
std::vector<int32_t> tokens_of(const mt::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("warning: ", 0) != 0) return json::parse(line)["tokens"].get<std::vector<int32_t>>();
  ADD_FAILURE() << "no output line in:\n" << r.output;
  return {};
}

void expect_error(const mt::CommandResult& r, const std::vector<std::string>& says) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  for (const auto& s : says) EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
}

TEST(CheckpointArgs, FlatAndNestedKeysAndTypes) {
  const CheckpointArgs flat({{"num_layers", 2}, {"layernorm_epsilon", 1e-5}, {"swiglu", nullptr}}, "m.json");
  EXPECT_EQ(flat.get_int("num_layers"), 2);
  EXPECT_EQ(flat.get_double("layernorm_epsilon"), 1e-5);
  EXPECT_FALSE(flat.get_bool("swiglu"));  // null = absent
  EXPECT_FALSE(flat.get_int("hidden_size"));
  const CheckpointArgs nested({{"model", {{"num_layers", 3}, {"gelu_tanh", false}}},
                               {"tokenizer", {{"type", "GPT2BPETokenizer"}}},
                               {"num_layers", nullptr}},
                              "m.json");
  EXPECT_EQ(nested.get_int("num_layers"), 3);
  EXPECT_EQ(nested.get_bool("gelu_tanh"), false);
  EXPECT_EQ(nested.get_string("tokenizer.type"), "GPT2BPETokenizer");
  EXPECT_FALSE(nested.get_string("tokenizer.vocab_file"));
  try {
    CheckpointArgs({{"num_layers", "2"}}, "m.json").get_int("num_layers");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"num_layers\" should be an integer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CheckpointArgs(json::array(), "m.json"), Error);
}

TEST(UseCheckpointArgs, GenerateTakesTheShapeFromTheCheckpoint) {
  const auto config = testing::gpt2_config();
  Checkpoint ckpt(config, gpt2_args());
  const auto want = greedy(config, ckpt.weights, {1, 2, 3}, 6);
  EXPECT_EQ(tokens_of(generate_cli(ckpt, " --use-checkpoint-args" + kTokenizer)), want);
  // Flags that agree are fine.
  EXPECT_EQ(tokens_of(generate_cli(ckpt, " --use-checkpoint-args --num-layers 2 --hidden-size 32"
                                         " --ffn-hidden-size 128 --seq-length 32" + kTokenizer)),
            want);

  // Nested under "model", with the activation recorded: exact GeLU changes the output.
  json nested = {{"model", gpt2_args()}, {"make_vocab_size_divisible_by", 64}};
  nested["model"]["gelu_tanh"] = false;
  ckpt.set_args(nested);
  auto erf = config;
  erf.activation = "gelu";
  const auto want_erf = greedy(erf, ckpt.weights, {1, 2, 3}, 6);
  EXPECT_EQ(tokens_of(generate_cli(ckpt, " --use-checkpoint-args --tokenizer-type NullTokenizer"
                                         " --vocab-size 60")),
            want_erf);
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --openai-gelu" + kTokenizer),
               {"--openai-gelu (GeLU (tanh form))", "activation is GeLU (exact erf form)", "metadata.json"});
}

TEST(UseCheckpointArgs, MegatronStyleKeysForALlamaShape) {
  const auto config = testing::llama_config();
  const json args = {{"num_layers", 2},
                     {"hidden_size", 32},
                     {"num_attention_heads", 4},
                     {"group_query_attention", true},
                     {"num_query_groups", 2},
                     {"ffn_hidden_size", 48},
                     {"max_position_embeddings", 32},
                     {"normalization", "RMSNorm"},
                     {"swiglu", true},
                     {"position_embedding_type", "rope"},
                     {"rotary_percent", 0.5},
                     {"add_bias_linear", false},
                     {"add_qkv_bias", false},
                     {"untie_embeddings_and_output_weights", true},
                     {"tokenizer_type", "NullTokenizer"},
                     {"kv_channels", nullptr}};
  Checkpoint ckpt(config, args);
  EXPECT_EQ(tokens_of(generate_cli(ckpt, " --use-checkpoint-args" + kTokenizer)),
            greedy(config, ckpt.weights, {1, 2, 3}, 6));
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --num-query-groups 4 --group-query-attention" + kTokenizer),
               {"--num-query-groups 4", "num_query_groups is 2"});
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --normalization LayerNorm" + kTokenizer),
               {"--normalization 'LayerNorm'", "normalization is 'RMSNorm'"});
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --tokenizer-type GPT2BPETokenizer"),
               {"--tokenizer-type GPT2BPETokenizer", "'NullTokenizer'"});
}

TEST(UseCheckpointArgs, MistakesAreClearErrors) {
  const auto config = testing::gpt2_config();
  Checkpoint ckpt(config, gpt2_args());
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --num-layers 3" + kTokenizer),
               {"--num-layers 3", "num_layers is 2", "iter_0000005/metadata.json"});
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --max-position-embeddings 16" + kTokenizer),
               {"--max-position-embeddings 16", "max_position_embeddings is 32"});
  // Without --use-checkpoint-args the shape flags are required.
  expect_error(generate_cli(ckpt, kTokenizer + " --max-position-embeddings 32"),
               {"--num-layers is required", "--use-checkpoint-args"});

  // A needed key missing: named, with the flag to pass instead.
  json args = gpt2_args();
  args.erase("num_layers");
  ckpt.set_args(args);
  expect_error(generate_cli(ckpt, " --use-checkpoint-args" + kTokenizer),
               {"has no \"num_layers\"", "pass --num-layers"});
  EXPECT_EQ(tokens_of(generate_cli(ckpt, " --use-checkpoint-args --num-layers 2" + kTokenizer)),
            greedy(config, ckpt.weights, {1, 2, 3}, 6));
  args.erase("max_position_embeddings");
  args.erase("seq_length");
  args["num_layers"] = "2";
  ckpt.set_args(args);
  expect_error(generate_cli(ckpt, " --use-checkpoint-args" + kTokenizer), {"should be an integer"});
  args["num_layers"] = 2;
  ckpt.set_args(args);
  expect_error(generate_cli(ckpt, " --use-checkpoint-args" + kTokenizer),
               {"neither max_position_embeddings nor seq_length"});

  // No metadata.json (e.g. a converted checkpoint), or no "args" in it.
  Checkpoint bare(config, json());
  expect_error(generate_cli(bare, " --use-checkpoint-args" + kTokenizer),
               {"metadata.json does not exist", "drop --use-checkpoint-args"});
  mt::write_file(bare.dir.path() / "iter_0000005" / "metadata.json", R"({"iteration": 5})");
  expect_error(generate_cli(bare, " --use-checkpoint-args" + kTokenizer), {"no \"args\" object"});
  // --ckpt-step picks the metadata of that iteration.
  expect_error(generate_cli(ckpt, " --use-checkpoint-args --ckpt-step 7" + kTokenizer), {"iter_0000007"});
}

// Without --use-checkpoint-args the flags describe the model, but a checkpoint that has metadata
// is still checked: a forgotten flag whose default builds a different model (the GeLU form, the
// epsilon, the vocabulary padding) is an error naming the flag, not silently wrong text.
TEST(UseCheckpointArgs, FlagsAndDefaultsAreCheckedAgainstTheMetadata) {
  auto config = testing::gpt2_config();
  config.activation = "gelu";  // trained with the exact GeLU
  config.layernorm_epsilon = 1e-6;
  json args = gpt2_args();
  args["openai_gelu"] = false;
  args["bias_gelu_fusion"] = false;
  args["layernorm_epsilon"] = 1e-6;
  args["make_vocab_size_divisible_by"] = 64;
  Checkpoint ckpt(config, args);
  const std::string shape = " --num-layers 2 --hidden-size 32 --num-attention-heads 4"
                            " --max-position-embeddings 32" + kTokenizer;
  // The defaults: tanh GeLU (Megatron's fused bias-GeLU) and epsilon 1e-5.
  expect_error(generate_cli(ckpt, shape + " --norm-epsilon 1e-6"),
               {"the default activation (GeLU (tanh form)", "--no-bias-gelu-fusion",
                "activation is GeLU (exact erf form)", "iter_0000005/metadata.json",
                "--use-checkpoint-args"});
  expect_error(generate_cli(ckpt, shape + " --no-bias-gelu-fusion"),
               {"the default --norm-epsilon 1e-05", "layernorm_epsilon is 1e-06"});
  expect_error(generate_cli(ckpt, " --num-layers 3 --hidden-size 32 --num-attention-heads 4"
                                  " --max-position-embeddings 32 --no-bias-gelu-fusion --norm-epsilon 1e-6" +
                                  kTokenizer),
               {"--num-layers 3", "num_layers is 2"});
  expect_error(generate_cli(ckpt, shape + " --openai-gelu --norm-epsilon 1e-6"),
               {"--openai-gelu (GeLU (tanh form))", "activation is GeLU (exact erf form)"});
  expect_error(generate_cli(ckpt, " --num-layers 2 --hidden-size 32 --num-attention-heads 4"
                                  " --seq-length 16 --no-bias-gelu-fusion --norm-epsilon 1e-6" + kTokenizer),
               {"--seq-length (no --max-position-embeddings) 16", "max_position_embeddings is 32"});
  // (--ffn-hidden-size given: without it --swiglu derives Megatron's narrower width, named first)
  expect_error(generate_cli(ckpt, shape + " --no-bias-gelu-fusion --norm-epsilon 1e-6 --swiglu"
                                          " --ffn-hidden-size 128"),
               {"--swiglu", "activation is GeLU (exact erf form)"});
  expect_error(generate_cli(ckpt, shape + " --no-bias-gelu-fusion --norm-epsilon 1e-6 --swiglu"),
               {"--ffn-hidden-size 64", "ffn_hidden_size is 128"});
  // Matching flags generate exactly what the model computes; so does --use-checkpoint-args.
  const auto want = greedy(config, ckpt.weights, {1, 2, 3}, 6);
  EXPECT_EQ(tokens_of(generate_cli(ckpt, shape + " --no-bias-gelu-fusion --norm-epsilon 1e-6")), want);
  EXPECT_EQ(tokens_of(generate_cli(ckpt, " --use-checkpoint-args" + kTokenizer)), want);
  // A padding multiple that differs is named too (the tensors would not even fit).
  args["make_vocab_size_divisible_by"] = 32;
  ckpt.set_args(args);
  expect_error(generate_cli(ckpt, shape + " --no-bias-gelu-fusion --norm-epsilon 1e-6"),
               {"--make-vocab-size-divisible-by 64", "make_vocab_size_divisible_by is 32"});
  // No metadata: nothing to check against, the flags are trusted.
  Checkpoint bare(config, json());
  EXPECT_EQ(tokens_of(generate_cli(bare, shape + " --no-bias-gelu-fusion --norm-epsilon 1e-6")),
            greedy(config, bare.weights, {1, 2, 3}, 6));
}

TEST(UseCheckpointArgs, ServeTakesTheShapeFromTheCheckpoint) {
  const auto config = testing::gpt2_config();
  Checkpoint ckpt(config, gpt2_args());
  const std::string log = (ckpt.dir.path() / "serve.log").string();
  // --port 0 picks a free port; the log line "serving on http://127.0.0.1:PORT" names it.
  const std::string cmd = "exec '" + mt::cli_path().string() + "' serve --load " +
                          ckpt.dir.path().string() + " --use-checkpoint-args" + kTokenizer +
                          " --port 0 > '" + log + "' 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  struct StopOnExit {  // the server must not outlive a failed assertion
    pid_t pid;
    ~StopOnExit() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } guard{pid};
  int port = 0;
  for (int i = 0; i < 400 && port == 0; ++i) {
    const std::string text = std::filesystem::exists(log) ? mt::read_file(log) : std::string();
    const size_t at = text.find("serving on http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(text.c_str() + at + 28);
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(port, 0) << mt::read_file(log);
  if (port > 0) {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Put("/api", R"({"prompts": ["1 2 3"], "tokens_to_generate": 6, "top_k": 1})",
                     "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>(),
              greedy(config, ckpt.weights, {1, 2, 3}, 6));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  guard.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << mt::read_file(log);
  // A contradiction stops serve before it binds.
  expect_error(mt::run_cli("serve --load " + ckpt.dir.path().string() +
                           " --use-checkpoint-args --hidden-size 64 --port 0" + kTokenizer),
               {"--hidden-size 64", "hidden_size is 32"});
}

// The metadata a real training run writes is enough to generate with.
TEST(UseCheckpointArgs, CheckpointFromPretrainGpt) {
  mt::TempDir dir;
  const std::string prefix = (dir / "corpus").string();
  {
    data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 30; ++i) doc.push_back((d + 3 * i) % 60);
      doc.push_back(63);
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
  }
  const std::string shape = " --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
                            " --max-position-embeddings 16 --openai-gelu";
  const std::string tok = " --tokenizer-type NullTokenizer --vocab-size 64 --make-vocab-size-divisible-by 8";
  const std::string ckpt = (dir / "ckpt").string();
  const auto train = mt::run_cli("pretrain-gpt" + shape + tok + " --micro-batch-size 2 --lr 1e-3"
                                 " --train-iters 3 --split 90,10,0 --eval-iters 1 --data-path " + prefix + " --data-cache-path " +
                                 (dir / "cache").string() + " --save " + ckpt + " --save-interval 3");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string gen = "--log-level warn generate --load " + ckpt + tok +
                          " --prompt '1 2 3' --num-tokens-to-generate 5 --output-format jsonl";
  const auto with_flags = mt::run_cli(gen + shape);
  const auto from_ckpt = mt::run_cli(gen + " --use-checkpoint-args");
  ASSERT_EQ(with_flags.exit_code, 0) << with_flags.output;
  ASSERT_EQ(from_ckpt.exit_code, 0) << from_ckpt.output;
  EXPECT_EQ(json::parse(from_ckpt.output)["tokens"], json::parse(with_flags.output)["tokens"]);
  expect_error(mt::run_cli(gen + " --use-checkpoint-args --num-attention-heads 4"),
               {"--num-attention-heads 4", "num_attention_heads is 2"});
}

}  // namespace
}  // namespace megatron::inference
