// `megatron generate` on a checkpoint of `megatron pretrain-t5`: the prompt's <extra_id_N>
// sentinels are filled from the decoder's output (text and jsonl), the tokenizer's sentinels
// come from the checkpoint with --use-checkpoint-args, and the mistakes a user can make with a T5
// checkpoint are clear errors: a sentinel the tokenizer lacks, a contradicting --vocab-extra-ids,
// a prompt longer than the encoder takes, GPT-only flags, and evaluate's zero-shot GPT tasks.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/sentence_corpus.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

class T5GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    tok_ = new std::string(write_sentence_corpus(dir_->path()));
    const auto r = run_command(
        cli_path().string() + " pretrain-t5" + *tok_ + " --vocab-extra-ids 10 --num-layers 2"
        " --decoder-num-layers 1 --hidden-size 32 --num-attention-heads 4"
        " --encoder-seq-length 32 --decoder-seq-length 16 --max-position-embeddings 32"
        " --position-embedding-type relative --micro-batch-size 2 --global-batch-size 4"
        " --lr 1e-3 --train-iters 4 --eval-iters 0 --split 90,10,0 --data-path '" +
        (dir_->path() / "corpus_text_sentence").string() + "' --data-cache-path '" +
        (dir_->path() / "cache").string() + "' --save '" + ckpt() + "' --save-interval 4 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  static std::string ckpt() { return (dir_->path() / "ckpt").string(); }
  static CommandResult run(const std::string& command, const std::string& args) {
    return run_command("timeout 120 " + cli_path().string() + " " + command + " --load '" +
                       ckpt() + "'" + *tok_ + args + " 2>&1");
  }
  static void fails_with(const std::string& command, const std::string& args,
                         const std::string& what) {
    const auto r = run(command, args);
    EXPECT_NE(r.exit_code, 0) << command << args;
    EXPECT_NE(r.output.find(what), std::string::npos) << command << args << ": " << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  }
  static TempDir* dir_;
  static std::string* tok_;
};

TempDir* T5GenerateCli::dir_ = nullptr;
std::string* T5GenerateCli::tok_ = nullptr;

TEST_F(T5GenerateCli, FillsTheSentinelSpans) {
  const auto r = run("generate", " --use-checkpoint-args --prompt 'the cat <extra_id_0> on the"
                     " mat . <extra_id_1> in the park .' --num-tokens-to-generate 6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The prompt comes back with the spans the decoder wrote for its sentinels in [...], then the
  // decoder's own output, which starts with the first sentinel once trained (or anything after
  // four steps: only the form is checked here).
  EXPECT_NE(r.output.find("\nthe cat "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\noutput: "), std::string::npos) << r.output;

  const auto j = run("generate", " --use-checkpoint-args --prompt 'the cat <extra_id_0> on the"
                     " mat .' --num-tokens-to-generate 5 --top_k 0 --top_p 0.9 --random-seed 3"
                     " --return-log-probs --output-format jsonl");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  std::istringstream lines(j.output);
  std::string line, json_line;
  while (std::getline(lines, line))
    if (!line.empty() && line[0] == '{') json_line = line;
  ASSERT_FALSE(json_line.empty()) << j.output;
  const auto o = nlohmann::json::parse(json_line);
  EXPECT_EQ(o["prompt"], "the cat <extra_id_0> on the mat .");
  for (const char* key : {"text", "output", "spans", "tokens", "logprobs"})
    EXPECT_TRUE(o.contains(key)) << key << ": " << json_line;
  // At most 5 tokens after [BOS]; a log-prob for each.
  EXPECT_LE(o["tokens"].size(), 5u);
  EXPECT_GE(o["tokens"].size(), 1u);
  EXPECT_EQ(o["logprobs"].size(), o["tokens"].size());
  // The same seed, the same sample.
  const auto again = run("generate", " --use-checkpoint-args --prompt 'the cat <extra_id_0> on"
                         " the mat .' --num-tokens-to-generate 5 --top_k 0 --top_p 0.9"
                         " --random-seed 3 --return-log-probs --output-format jsonl");
  EXPECT_EQ(again.output, j.output);
  // Beam search over the same prompt.
  const auto beams = run("generate", " --use-checkpoint-args --prompt 'the cat <extra_id_0> .'"
                         " --num-tokens-to-generate 4 --beam-width 2");
  ASSERT_EQ(beams.exit_code, 0) << beams.output;
  EXPECT_NE(beams.output.find("score: "), std::string::npos) << beams.output;
}

TEST_F(T5GenerateCli, RefusesWhatDoesNotFit) {
  fails_with("generate", " --use-checkpoint-args --prompt 'a <extra_id_10> b'",
             "has <extra_id_10> but the tokenizer has 10 sentinels");
  fails_with("generate", " --use-checkpoint-args --vocab-extra-ids 5 --prompt 'a <extra_id_0>'",
             "--vocab-extra-ids 5 contradicts the checkpoint, whose vocab_extra_ids is 10");
  fails_with("generate", " --use-checkpoint-args --add-BOS --prompt 'a <extra_id_0>'",
             "a T5 decoder always starts from [BOS]");
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "the ";
  fails_with("generate", " --use-checkpoint-args --prompt '" + long_prompt + "<extra_id_0>'",
             "prompt 1 has 41 tokens, more than the encoder takes (--max-position-embeddings 32)");
  fails_with("evaluate", " --use-checkpoint-args --task LAMBADA --valid-data x.jsonl",
             "which run a GPT model; --load holds a T5 checkpoint");
}

}  // namespace
}  // namespace megatron::testing
