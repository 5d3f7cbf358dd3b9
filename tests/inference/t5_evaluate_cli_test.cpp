// `megatron evaluate` on a checkpoint of `megatron pretrain-t5`: the span-corruption loss of a
// split of pretrain-t5's data equals the validation loss the training run printed for that
// checkpoint and those samples (the same samples in the same micro-batches through the same loss),
// on one process and on two data-parallel ranks under launch, and for a checkpoint trained with
// --tensor-model-parallel-size 2 on its two tensor-parallel ranks (the loss over the vocabulary
// padded for two ranks, as that training's); Megatron's zero-shot GPT tasks and flags of the other
// families are refused with the reason.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "cli/sentence_corpus.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

// The "lm loss value: X" of the line that contains `marker` (empty when none).
std::string loss_value(const std::string& output, const std::string& marker) {
  const std::regex line(marker + R"([^\n]*\| lm loss value: ([0-9.E+-]+) \|)");
  std::smatch m;
  return std::regex_search(output, m, line) ? m[1].str() : "";
}

class T5EvaluateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    tok_ = new std::string(write_sentence_corpus(dir_->path()));
    train_output_ = new std::string(train("", "ckpt"));
  }
  // Trains the tiny T5 (after `launch`) into `name`; returns the output.
  static std::string train(const std::string& launch, const std::string& name,
                           const std::string& more = "") {
    const auto r = run_command(
        "OMP_NUM_THREADS=1 " + cli_path().string() + " " + launch + "pretrain-t5" + *tok_ +
        " --vocab-extra-ids 10 --num-layers 2 --decoder-num-layers 1 --hidden-size 32"
        " --num-attention-heads 4 --encoder-seq-length 32 --decoder-seq-length 16"
        " --max-position-embeddings 32 --position-embedding-type relative --lr 1e-3" +
        data_flags() + more + " --save '" + ckpt(name) + "' --save-interval 4 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  }
  static void TearDownTestSuite() {
    delete train_output_;
    delete tok_;
    delete dir_;
  }
  // The data and sizing flags training and evaluation share (they size the splits alike).
  static std::string data_flags(const std::string& split = "70,30,0", const std::string& gbs = "4") {
    return " --micro-batch-size 2 --global-batch-size " + gbs + " --train-iters 4 --eval-interval 4"
           " --eval-iters 2 --split " + split + " --data-path '" +
           (dir_->path() / "corpus_text_sentence").string() + "' --data-cache-path '" +
           (dir_->path() / "cache").string() + "'";
  }
  static std::string ckpt(const std::string& name = "ckpt") { return (dir_->path() / name).string(); }
  static CommandResult evaluate(const std::string& args, const std::string& launch = "",
                                const std::string& name = "ckpt") {
    return run_command("OMP_NUM_THREADS=1 timeout 300 " + cli_path().string() + " " + launch +
                       "evaluate --load '" + ckpt(name) + "'" + *tok_ + " --use-checkpoint-args" +
                       args + " 2>&1");
  }
  static void fails_with(const std::string& args, const std::string& what) {
    const auto r = evaluate(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  }
  static TempDir* dir_;
  static std::string* tok_;
  static std::string* train_output_;
};

TempDir* T5EvaluateCli::dir_ = nullptr;
std::string* T5EvaluateCli::tok_ = nullptr;
std::string* T5EvaluateCli::train_output_ = nullptr;

TEST_F(T5EvaluateCli, ScoresTheValidationLossTrainingPrinted) {
  // Training's evaluation at iteration 4 scored the first --eval-iters x --global-batch-size
  // validation samples with the weights it then saved.
  const std::string trained = loss_value(*train_output_, "validation loss at iteration 4 ");
  ASSERT_FALSE(trained.empty()) << *train_output_;
  const auto r = evaluate(data_flags());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(loss_value(r.output, "validation loss at iteration 4 on valid split"), trained) << r.output;
  EXPECT_NE(r.output.find("> evaluating the valid split: 4 micro-batches of 2 samples"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done :-)"), std::string::npos) << r.output;
  // Two data-parallel ranks share the micro-batches and sum the losses.
  const auto two = evaluate(data_flags(), "launch --nproc-per-node 2 -- ");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(loss_value(two.output, "validation loss at iteration 4 on valid split"), trained) << two.output;
  // Another split is another loss.
  const auto train = evaluate(data_flags() + " --split-name train");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string on_train = loss_value(train.output, "on train split");
  EXPECT_FALSE(on_train.empty()) << train.output;
  EXPECT_NE(on_train, trained);
}

TEST_F(T5EvaluateCli, TensorParallelRanksScoreWhatTheirTrainingPrinted) {
  const std::string two = "launch --nproc-per-node 2 -- ";
  const std::string out = train(two, "tp2", " --tensor-model-parallel-size 2");
  const std::string trained = loss_value(out, "validation loss at iteration 4 ");
  ASSERT_FALSE(trained.empty()) << out;
  const auto r = evaluate(data_flags() + " --tensor-model-parallel-size 2", two, "tp2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(loss_value(r.output, "validation loss at iteration 4 on valid split"), trained) << r.output;
}

TEST_F(T5EvaluateCli, RefusesWhatDoesNotApplyToT5) {
  fails_with(" --task LAMBADA --valid-data x.jsonl",
             "--task names Megatron's zero-shot tasks (tasks/zeroshot_gpt), which run a GPT model");
  fails_with(data_flags() + " --bert-no-binary-head", "is BERT's; --load holds a T5 checkpoint");
  fails_with(" --micro-batch-size 2", "evaluating a T5 checkpoint needs pretrain-t5's data");
  fails_with(data_flags("70,30,0", "3"),
             "--global-batch-size 3 is not a multiple of --micro-batch-size 2");
  fails_with(data_flags("100,0,0"), "the valid split is empty");
}

}  // namespace
}  // namespace megatron::testing
