// `megatron pretrain-t5` on Megatron's span-corruption samples of a WordPiece corpus follows an
// independent PyTorch run (tests/reference/t5_train_reference.py: Megatron-Core's T5 with
// pretrain_t5.py's loss, two micro-batches an iteration, global-norm clipping, Adam with decoupled
// weight decay off biases and norms, the warm-up and linear decay of OptimizerParamScheduler)
// started from the same initial weights (our iteration-1 checkpoint, whose warm-up rate is 0) on
// the samples `megatron inspect-data --dataset-type t5 --format json` prints: the same loss at
// every iteration, relative position bias and encoder and decoder of different depths included.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <vector>

#include "cli/sentence_corpus.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

std::vector<double> losses(const std::string& log, const std::string& pattern) {
  std::vector<double> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1].str()));
  return out;
}

TEST(T5TrainReference, LossCurveIsPyTorchsFromTheSameWeights) {
  TempDir dir;
  const std::string m = cli_path().string();
  const std::string tok = write_sentence_corpus(dir.path()) + " --vocab-extra-ids 10";
  const std::string seq = " --encoder-seq-length 32 --decoder-seq-length 16 --mask-prob 0.3";
  const std::string data = " --split 90,10,0 --data-path '" + (dir / "corpus_text_sentence").string() +
                           "' --data-cache-path '" + (dir / "cache").string() + "'";
  const std::string batch = " --micro-batch-size 2 --global-batch-size 4 --train-iters 12";
  const std::string train =
      " pretrain-t5 --encoder-num-layers 2 --decoder-num-layers 1 --hidden-size 32"
      " --num-attention-heads 4 --max-position-embeddings 32 --init-method-std 0.1"
      " --position-embedding-type relative --relative-attention-num-buckets 8"
      " --lr 5e-3 --min-lr 1e-4 --lr-decay-style linear --lr-warmup-iters 3 --weight-decay 0.01"
      " --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 --log-interval 1"
      " --eval-interval 100 --eval-iters 1" + seq + tok + data + batch;
  const auto first = run_command(m + train + " --save '" + (dir / "ckpt").string() +
                                 "' --save-interval 1 --exit-interval 1 2>&1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto run = run_command(m + train + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto samples = run_command(m + " inspect-data --samples 48 --format json --dataset-type t5"
                                   " --split-name train" + seq + tok + data + batch + " 2>/dev/null"
                                   " | grep '^{' > '" + (dir / "samples.jsonl").string() + "'");
  ASSERT_EQ(samples.exit_code, 0) << samples.output;
  const auto ref = run_command("/usr/bin/python3 '" +
                               (source_dir() / "tests/reference/t5_train_reference.py").string() + "' '" +
                               (dir / "ckpt" / "iter_0000001").string() + "' '" +
                               (dir / "samples.jsonl").string() + "' 12 2>&1");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::vector<double> ours = losses(run.output, "\\| lm loss: ([0-9.eE+-]+)");
  const std::vector<double> theirs = losses(ref.output, "lm loss ([0-9.eE+-]+)");
  ASSERT_EQ(ours.size(), 12u) << run.output;
  ASSERT_EQ(theirs.size(), 12u) << ref.output;
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_NEAR(ours[i], theirs[i], 1e-5 * theirs[i]) << "iteration " << i + 1 << "\n" << ref.output;
  // The run learns: the last loss is well below the first.
  EXPECT_LT(ours.back(), ours.front() - 0.5) << run.output;
}

}  // namespace
}  // namespace megatron::testing
