// `megatron pretrain-t5` on Megatron's T5 span-corruption dataset end to end: a WordPiece
// vocabulary and sentence-split data through preprocess-data, a short run with --data-path and
// --vocab-extra-ids whose training loss is finite and falls and whose validation lines are
// printed, --mock-data still accepted by the same command, and the errors a user meets with real
// data (no sentinels, a tokenizer that is not WordPiece).
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/sentence_corpus.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

struct T5Cli {
  TempDir dir;
  std::string m = cli_path().string();
  std::string model, data, tok;
  T5Cli() {
    tok = write_sentence_corpus(dir.path());
    model = " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --encoder-seq-length 32"
            " --decoder-seq-length 16 --max-position-embeddings 32 --micro-batch-size 2"
            " --global-batch-size 4 --lr 1e-3 --log-interval 1 --eval-interval 6 --eval-iters 1";
    data = " --split 90,10,0 --data-path '" + (dir / "corpus_text_sentence").string() +
           "' --data-cache-path '" + (dir / "cache").string() + "'";
  }
};

std::vector<double> lm_losses(const std::string& log) {
  std::vector<double> out;
  const std::regex re("\\| lm loss: ([0-9.eE+-]+|nan|inf)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1].str()));
  return out;
}

TEST(PretrainT5Cli, TrainsAndEvaluatesOnMegatronsSpanCorruption) {
  T5Cli c;
  const auto r = run_command(c.m + " pretrain-t5" + c.tok + " --vocab-extra-ids 10" + c.model +
                             c.data + " --train-iters 12 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> losses = lm_losses(r.output);
  ASSERT_EQ(losses.size(), 12u) << r.output;
  for (double l : losses) EXPECT_TRUE(std::isfinite(l)) << r.output;
  // Uniform over the padded vocabulary is ln 128 = 4.85; twelve steps on 60 small documents
  // lower it by more than 0.2 (about 0.4 on this data).
  EXPECT_LT(losses.back(), losses.front() - 0.2) << r.output;
  EXPECT_NE(r.output.find(" validation loss at iteration 6 | lm loss value: "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" validation loss at iteration 12 on validation set | lm loss value: "),
            std::string::npos) << r.output;
}

TEST(PretrainT5Cli, MockDataStillTrains) {
  T5Cli c;
  const auto r = run_command(c.m + " pretrain-t5" + c.tok + " --vocab-extra-ids 10" + c.model +
                             " --mock-data --train-iters 2 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lm_losses(r.output).size(), 2u) << r.output;
}

TEST(PretrainT5Cli, RefusesWhatItsDataCannotGive) {
  T5Cli c;
  auto fails_with = [&](const std::string& args, const std::string& what) {
    const auto r = run_command(c.m + " pretrain-t5" + args + c.model + c.data + " --train-iters 2 2>&1");
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << args << ": " << r.output;
  };
  fails_with(c.tok, "--vocab-extra-ids N");
  fails_with(" --tokenizer-type NullTokenizer --vocab-size 100", "WordPiece tokenizer");
  fails_with(c.tok + " --vocab-extra-ids 10 --mock-data", "--mock-data cannot be combined");
  fails_with(c.tok + " --vocab-extra-ids 10 --mask-prob 1.5", "--mask-prob");
}

}  // namespace
}  // namespace megatron::testing
