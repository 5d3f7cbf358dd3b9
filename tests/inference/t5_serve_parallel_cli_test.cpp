// `megatron serve` on a checkpoint of `megatron pretrain-t5`: PUT /api takes prompts with
// <extra_id_N> sentinels as the encoder's inputs and answers with the spans the decoder wrote,
// the same tokens (and log-probs within 1e-5) as `megatron generate` gives for those prompts:
// greedy, sampled with a seed, beam search, and requests sent at once (continuous batching: each
// slot holds its own encoder input). Fields that do not apply to T5, sentinels the tokenizer
// lacks and /v1/completions are 400s with the reason.
// Under launch with --tensor-model-parallel-size 2 (the checkpoint converted to TP2 by
// `checkpoint convert`), generate gives the single process's tokens and log-probs (within 1e-5),
// greedy, sampled and beam search, with prompts from flags or standard input; and serve answers
// as one process does, rank 0 serving and rank 1 following, until stopping it ends both.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/sentence_corpus.h"
#include "cli_test_util.h"
#include "serve_process.h"
#include "test_util.h"

namespace megatron::inference {
namespace {

namespace mt = megatron::testing;
using nlohmann::json;

const std::vector<std::string> kPrompts = {"the cat <extra_id_0> on the mat .",
                                           "a dog ran <extra_id_0> the park . <extra_id_1> warm today .",
                                           "<extra_id_0> sang in the tall trees ."};

class T5ServeCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new mt::TempDir();
    tok_ = new std::string(mt::write_sentence_corpus(dir_->path()));
    const auto r = mt::run_command(
        mt::cli_path().string() + " pretrain-t5" + *tok_ + " --vocab-extra-ids 10 --num-layers 2"
        " --decoder-num-layers 2 --hidden-size 32 --num-attention-heads 4"
        " --encoder-seq-length 32 --decoder-seq-length 16 --max-position-embeddings 32"
        " --position-embedding-type relative --micro-batch-size 2 --global-batch-size 4"
        " --lr 3e-3 --train-iters 8 --eval-iters 0 --split 90,10,0 --data-path '" +
        (dir_->path() / "corpus_text_sentence").string() + "' --data-cache-path '" +
        (dir_->path() / "cache").string() + "' --save '" + ckpt() + "' --save-interval 8 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  static std::string ckpt(const std::string& name = "ckpt") { return (dir_->path() / name).string(); }
  static std::string model_flags(const std::string& name = "ckpt") {
    return " --load '" + ckpt(name) + "'" + *tok_ + " --use-checkpoint-args";
  }
  // `megatron generate --output-format jsonl` over `prompts` with `flags` (`launch` before it).
  static std::vector<json> generate(const std::vector<std::string>& prompts, const std::string& flags,
                                    const std::string& launch = "", const std::string& name = "ckpt") {
    std::string args;
    for (const auto& p : prompts) args += " --prompt '" + p + "'";
    const auto r = mt::run_command("OMP_NUM_THREADS=1 timeout 120 " + mt::cli_path().string() + " " +
                                   launch + "generate" + model_flags(name) + args +
                                   " --output-format jsonl " + flags + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::json_lines(r.output);
  }
  // The checkpoint converted to tensor-parallel size 2 (once).
  static std::string tp2_checkpoint() {
    if (!std::filesystem::exists(ckpt("tp2"))) {
      const auto r = mt::run_command(mt::cli_path().string() + " checkpoint convert --load '" +
                                     ckpt() + "' --save '" + ckpt("tp2") +
                                     "' --target-tensor-parallel-size 2 2>&1");
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    return ckpt("tp2");
  }
  static json put(testing::ServeProcess& server, const json& body, int status = 200) {
    const auto res = server.put_api(body.dump());
    EXPECT_TRUE(res) << server.log();
    if (!res) return json();
    EXPECT_EQ(res->status, status) << body.dump() << ": " << res->body;
    return json::parse(res->body);
  }
  static mt::TempDir* dir_;
  static std::string* tok_;
};

mt::TempDir* T5ServeCli::dir_ = nullptr;
std::string* T5ServeCli::tok_ = nullptr;

// The server's answer `got` for prompts[i] against generate's line `want`.
void expect_same(const json& got, size_t i, const json& want, bool logprobs) {
  EXPECT_EQ(got["tokens"][i], want["tokens"]) << i;
  EXPECT_EQ(got["text"][i], want["text"]) << i;
  EXPECT_EQ(got["output"][i], want["output"]) << i;
  EXPECT_EQ(got["spans"][i], want["spans"]) << i;
  EXPECT_EQ(got["segments"][i].size(), want["tokens"].size()) << i;
  if (!logprobs) return;
  ASSERT_EQ(got["logprobs"][i].size(), want["logprobs"].size()) << i;
  for (size_t j = 0; j < want["logprobs"].size(); ++j)
    EXPECT_NEAR(got["logprobs"][i][j].get<double>(), want["logprobs"][j].get<double>(), 1e-5) << i;
}

// The server's answers equal what the single-process `generate` writes: greedy, seeded sampling,
// requests sent at once (they share the running batch, each slot its own input) and beam search.
void expect_generate_answers(testing::ServeProcess& server,
                             const std::function<std::vector<json>(const std::vector<std::string>&,
                                                                   const std::string&)>& generate,
                             const std::function<json(const json&)>& put) {
  const auto greedy = generate(kPrompts, "--num-tokens-to-generate 6 --return-log-probs");
  const auto sampled = generate(kPrompts, "--num-tokens-to-generate 6 --return-log-probs --top_k 0"
                                          " --top_p 0.9 --random-seed 3");
  const auto beams = generate({kPrompts[1]}, "--num-tokens-to-generate 5 --beam-width 2");
  ASSERT_EQ(greedy.size(), kPrompts.size());
  ASSERT_EQ(sampled.size(), kPrompts.size());
  ASSERT_EQ(beams.size(), 2u);

  const json all = put({{"prompts", kPrompts}, {"tokens_to_generate", 6}, {"logprobs", true},
                        {"top_k", 1}});
  for (size_t i = 0; i < kPrompts.size(); ++i) expect_same(all, i, greedy[i], true);
  const json seeded = put({{"prompts", kPrompts}, {"tokens_to_generate", 6}, {"logprobs", true},
                           {"top_p", 0.9}, {"random_seed", 3}});
  for (size_t i = 0; i < kPrompts.size(); ++i) expect_same(seeded, i, sampled[i], true);
  EXPECT_TRUE(put({{"prompts", {kPrompts[0]}}, {"tokens_to_generate", 2}})["logprobs"].is_null());

  std::vector<std::future<json>> answers;
  for (const auto& p : kPrompts)
    answers.push_back(std::async(std::launch::async, [&put, p] {
      return put({{"prompts", {p}}, {"tokens_to_generate", 6}, {"logprobs", true}, {"top_k", 1}});
    }));
  for (size_t i = 0; i < kPrompts.size(); ++i) expect_same(answers[i].get(), 0, greedy[i], true);

  const json beam = put({{"prompts", {kPrompts[1]}}, {"tokens_to_generate", 5}, {"beam_width", 2}});
  ASSERT_EQ(beam["tokens"].size(), 2u) << beam.dump() << server.log();
  for (size_t k = 0; k < 2; ++k) {
    expect_same(beam, k, beams[k], false);
    EXPECT_NEAR(beam["scores"][k].get<double>(), beams[k]["score"].get<double>(), 1e-5);
  }
}

TEST_F(T5ServeCli, AnswersWhatGenerateWrites) {
  testing::ServeProcess server(model_flags() + " --max-batch-size 4", dir_->path() / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  expect_generate_answers(
      server, [](const auto& prompts, const auto& flags) { return generate(prompts, flags); },
      [&server](const json& body) { return put(server, body); });
  EXPECT_TRUE(server.stop()) << server.log();
}

// Under launch with --tensor-model-parallel-size 2: rank 0 serves, rank 1 runs its shard of every
// forward; the answers are the single process's. A request no rank could run is refused on rank 0
// and the ranks stay in step. Stopping the launcher stops the server, which ends the other rank.
// Launched ranks without that tensor-parallel size are refused.
TEST_F(T5ServeCli, TensorParallelServerAnswersWhatOneProcessAnswers) {
  tp2_checkpoint();
  testing::ServeProcess server(model_flags("tp2") + " --tensor-model-parallel-size 2"
                               " --max-batch-size 4", dir_->path() / "serve-tp2.log",
                               "launch --nproc-per-node 2 --");
  ASSERT_GT(server.port(), 0) << server.log();
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "the ";
  EXPECT_NE(put(server, {{"prompts", {long_prompt}}, {"tokens_to_generate", 4}}, 400)
                .value("error", "").find("more than the encoder takes"), std::string::npos);
  expect_generate_answers(
      server, [](const auto& prompts, const auto& flags) { return generate(prompts, flags); },
      [&server](const json& body) { return put(server, body); });
  // SIGTERM to the launcher: rank 0 stops the server and ends rank 1, which waits for its word
  // (mpirun, which forwards the signal, reports a signalled job with status 1).
  server.stop();
  EXPECT_TRUE(WIFEXITED(server.status())) << server.status() << "\n" << server.log();
  EXPECT_NE(server.log().find("stopped: all 2 ranks have finished"), std::string::npos)
      << server.log();

  const auto r = mt::run_command("OMP_NUM_THREADS=1 timeout 120 " + mt::cli_path().string() +
                                 " launch --nproc-per-node 2 -- serve" + model_flags() +
                                 " --port 0 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("serving a T5 checkpoint on 2 launched ranks needs "
                          "--tensor-model-parallel-size 2"), std::string::npos) << r.output;
}

TEST_F(T5ServeCli, TensorParallelRanksGenerateWhatOneProcessGenerates) {
  tp2_checkpoint();
  const std::string two = "launch --nproc-per-node 2 -- ";
  for (const std::string flags : {"--num-tokens-to-generate 6 --return-log-probs",
                                  "--num-tokens-to-generate 6 --return-log-probs --top_k 0"
                                  " --top_p 0.9 --random-seed 3"}) {
    const auto one = generate(kPrompts, flags);
    const auto tp = generate(kPrompts, flags + " --tensor-model-parallel-size 2", two, "tp2");
    ASSERT_EQ(one.size(), kPrompts.size());
    ASSERT_EQ(tp.size(), one.size()) << flags;  // rank 0 alone prints
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(tp[i]["tokens"], one[i]["tokens"]) << flags << " prompt " << i;
      EXPECT_EQ(tp[i]["text"], one[i]["text"]) << flags << " prompt " << i;
      ASSERT_EQ(tp[i]["logprobs"].size(), one[i]["logprobs"].size());
      for (size_t j = 0; j < one[i]["logprobs"].size(); ++j)
        EXPECT_NEAR(tp[i]["logprobs"][j].get<double>(), one[i]["logprobs"][j].get<double>(), 1e-5)
            << flags << " prompt " << i;
    }
  }
  const auto beams = generate({kPrompts[1]}, "--num-tokens-to-generate 5 --beam-width 2");
  const auto tp_beams = generate({kPrompts[1]}, "--num-tokens-to-generate 5 --beam-width 2"
                                 " --tensor-model-parallel-size 2", two, "tp2");
  ASSERT_EQ(tp_beams.size(), beams.size());
  for (size_t k = 0; k < beams.size(); ++k) {
    EXPECT_EQ(tp_beams[k]["tokens"], beams[k]["tokens"]);
    EXPECT_NEAR(tp_beams[k]["score"].get<double>(), beams[k]["score"].get<double>(), 1e-5);
  }
  // Prompts on standard input reach every rank.
  auto r = mt::run_command("printf 'the cat <extra_id_0> on the mat .\n' | OMP_NUM_THREADS=1 timeout 120 " +
                      mt::cli_path().string() + " " + two + "generate" + model_flags("tp2") +
                      " --tensor-model-parallel-size 2 --num-tokens-to-generate 6 --output-format jsonl 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto piped = testing::json_lines(r.output);
  ASSERT_EQ(piped.size(), 1u) << r.output;
  EXPECT_EQ(piped[0]["tokens"], generate({kPrompts[0]}, "--num-tokens-to-generate 6")[0]["tokens"]);

  // Launched ranks that are not the checkpoint's tensor-parallel size are refused.
  r = mt::run_command("OMP_NUM_THREADS=1 timeout 120 " + mt::cli_path().string() +
                      " launch --nproc-per-node 4 -- generate" + model_flags("tp2") +
                      " --tensor-model-parallel-size 2 --prompt 'a <extra_id_0>' 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("a T5 checkpoint runs on --tensor-model-parallel-size 2 ranks, but 4 were "
                          "launched"), std::string::npos) << r.output;
}

TEST_F(T5ServeCli, RefusesWhatDoesNotApply) {
  testing::ServeProcess server(model_flags(), dir_->path() / "serve-errors.log");
  ASSERT_GT(server.port(), 0) << server.log();
  auto refused = [&](const json& body, const std::string& what) {
    const json e = put(server, body, 400);
    EXPECT_NE(e.value("error", "").find(what), std::string::npos) << body.dump() << ": " << e.dump();
  };
  refused({{"prompts", {"a <extra_id_0>"}}, {"add_BOS", true}}, "this server holds a T5 model");
  refused({{"prompts", {"a <extra_id_0>"}}, {"stop_on_eol", true}}, "starts from [BOS] and stops at [EOS]");
  refused({{"prompts", {"a <extra_id_10> b"}}},
          "prompt 0 cannot be tokenized: prompt 0 has <extra_id_10> but the tokenizer has 10 sentinels");
  refused({{"prompts", {"a <extra_id_0>"}}, {"tokens_to_generate", 0}, {"logprobs", true}},
          "tokens_to_generate must be >= 1 for a T5 model");
  refused({{"prompts", {"a <extra_id_0>"}}, {"tokens_to_generate", 40}},
          "tokens_to_generate=40 with the decoder's [BOS] exceeds the model's maximum sequence length 32");
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "the ";
  refused({{"prompts", {long_prompt}}, {"tokens_to_generate", 4}},
          "prompt 0 has 40 tokens, more than the encoder takes");
  const auto res = httplib::Client("127.0.0.1", server.port())
                       .Post("/v1/completions", R"({"prompt": "a <extra_id_0>"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("send them to PUT /api"), std::string::npos) << res->body;
  // Without tokens_to_generate: Megatron's 64, or as many as the decoder's positions hold.
  EXPECT_LE(put(server, {{"prompts", {"a <extra_id_0>"}}})["tokens"][0].size(), 31u);
  // The server is still up and right after the mistakes.
  EXPECT_EQ(put(server, {{"prompts", {"a <extra_id_0>"}}, {"tokens_to_generate", 2}})["tokens"].size(), 1u);
  EXPECT_TRUE(server.stop()) << server.log();
}

}  // namespace
}  // namespace megatron::inference
