// `megatron evaluate` on a BERT checkpoint: a tiny BERT trained by `megatron pretrain-bert` on the
// test sentence corpus is scored on its validation split; the losses equal those pretrain-bert
// --skip-train logs for the same split and flags, the same on two data-parallel ranks and on the
// checkpoint resharded to TP2 under `megatron launch`, and the accuracies are those of an
// independent PyTorch BERT (tests/model/bert_reference_test.cpp checks the scores of each
// micro-batch). Mistakes (GPT-only flags, missing data, a binary-head flag that contradicts the
// checkpoint) are clear errors, and generate still refuses a BERT checkpoint.
#include <gtest/gtest.h>

#include <regex>

#include "comm/communicator.h"
#include "dataset/bert_test_data.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;

// The corpus, the vocabulary and a checkpoint of 12 iterations, made once per test process.
struct BertEvalFiles {
  mt::TempDir dir;
  std::string tokenizer, data, checkpoint;
  BertEvalFiles() {
    mt::write_bert_vocab(dir / "vocab.txt");
    mt::SentenceDataOptions o;
    o.documents = 200;
    o.long_sentence_rate = 0;
    o.max_sentence_length = 12;
    mt::write_sentence_dataset((dir / "sentences").string(), o);
    tokenizer = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + (dir / "vocab.txt").string() +
                " --make-vocab-size-divisible-by 32";
    data = " --data-path " + (dir / "sentences").string() + " --split 80,20,0 --data-cache-path " +
           (dir / "cache").string() +
           " --micro-batch-size 2 --global-batch-size 8 --train-iters 12 --eval-interval 6 --eval-iters 2";
    checkpoint = (dir / "ckpt").string();
    const auto r = mt::run_cli("pretrain-bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
                               "--seq-length 32 --max-position-embeddings 32 --lr 3e-3 --log-interval 100 "
                               "--save " + checkpoint + " --save-interval 12" + tokenizer + data + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
};

const BertEvalFiles& files() {
  static BertEvalFiles f;
  return f;
}

// "lm loss value: X" and "sop loss value: Y" of a validation line.
std::pair<double, double> losses(const std::string& output, const std::string& which) {
  std::smatch m;
  const std::regex line(which + R"( \| lm loss value: (\S+) \| lm loss PPL: \S+ \| sop loss value: (\S+) \|)");
  if (!std::regex_search(output, m, line)) {
    ADD_FAILURE() << "no '" << which << "' line in:\n" << output;
    return {0, 0};
  }
  return {std::stod(m[1].str()), std::stod(m[2].str())};
}

std::string evaluate_flags() {
  const auto& f = files();
  return " --load " + f.checkpoint + " --use-checkpoint-args" + f.tokenizer + f.data;
}

TEST(BertEvaluate, LossesAreThoseOfPretrainBertsEvaluation) {
  const auto& f = files();
  const auto skip = mt::run_cli("pretrain-bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
                                "--seq-length 32 --max-position-embeddings 32 --load " + f.checkpoint +
                                " --skip-train" + f.tokenizer + f.data + " 2>&1");
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  const auto want = losses(skip.output, "iteration 12 on validation set");
  const auto r = mt::run_cli("evaluate" + evaluate_flags() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto got = losses(r.output, "iteration 12 on valid split");
  EXPECT_NEAR(got.first, want.first, 1e-5 * want.first) << r.output;
  EXPECT_NEAR(got.second, want.second, 1e-5 * want.second) << r.output;
  // 2 iterations of 8 samples in micro-batches of 2; the accuracies are fractions.
  EXPECT_NE(r.output.find("evaluate: 8 micro-batches"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(lm accuracy: ([0-9.]+) \| sop accuracy: ([0-9.]+) \|)")))
      << r.output;
  EXPECT_GT(std::stod(m[1].str()), 0.0) << r.output;  // a trained model predicts some masked tokens
  EXPECT_LE(std::stod(m[1].str()), 1.0);
  EXPECT_LE(std::stod(m[2].str()), 1.0);
}

// Two data-parallel ranks, and the checkpoint resharded to TP2 on two and four ranks (TP2 x DP2),
// print the single process's line once.
TEST(BertEvaluate, DataAndTensorParallelRanksGiveTheSameResult) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const auto& f = files();
  const auto one = mt::run_cli("evaluate" + evaluate_flags() + " 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto want = losses(one.output, "on valid split");
  const std::string tp2 = (f.dir / "tp2").string();
  const auto conv = mt::run_cli("checkpoint convert --load " + f.checkpoint + " --save " + tp2 +
                                " --target-tensor-parallel-size 2 2>&1");
  ASSERT_EQ(conv.exit_code, 0) << conv.output;
  struct Case {
    int ranks;
    std::string load, extra;
  };
  for (const Case& c : {Case{2, f.checkpoint, ""}, Case{2, tp2, " --tensor-model-parallel-size 2"},
                        Case{4, tp2, " --tensor-model-parallel-size 2"}}) {
    SCOPED_TRACE(c.ranks);
    const auto r = mt::run_command("OMP_NUM_THREADS=1 '" + mt::cli_path().string() + "' launch --nproc-per-node " +
                                   std::to_string(c.ranks) + " -- evaluate --load " + c.load +
                                   " --use-checkpoint-args" + f.tokenizer + f.data + c.extra + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto got = losses(r.output, "on valid split");
    EXPECT_NEAR(got.first, want.first, 1e-5 * want.first) << r.output;
    EXPECT_NEAR(got.second, want.second, 1e-5 * want.second) << r.output;
    size_t lines = 0;
    for (size_t at = r.output.find("on valid split |"); at != std::string::npos;
         at = r.output.find("on valid split |", at + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << r.output;
  }
}

TEST(BertEvaluate, MistakesAreClearErrors) {
  const auto& f = files();
  const std::string base = "evaluate --load " + f.checkpoint + " --use-checkpoint-args" + f.tokenizer;
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {base + f.data + " --task LAMBADA", "--task is for the zero-shot GPT tasks"},
      {base + f.data + " --valid-data x.jsonl", "--valid-data is for the zero-shot GPT tasks"},
      {base + " --split 80,20,0", "needs pretrain-bert's data: --data-path"},
      {base + f.data + " --bert-no-binary-head", "--bert-no-binary-head contradicts the checkpoint"},
      {base + f.data + " --split-name test", "the test split is empty"},
      {base + std::regex_replace(f.data, std::regex("global-batch-size 8"), "global-batch-size 7"),
       "is not a multiple of --micro-batch-size"},
      {"generate --load " + f.checkpoint + " --use-checkpoint-args" + f.tokenizer + " --prompt hi",
       "need a GPT checkpoint"},
  };
  for (const Case& c : cases) {
    const auto r = mt::run_cli(c.args + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron
