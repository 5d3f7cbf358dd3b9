// `megatron pretrain-bert` end to end: WordPiece vocabulary and sentence-split data through
// preprocess-data, two short runs (with and without the binary head) whose log lines name both of
// pretrain_bert.py's losses, the checkpoint recording the family, and the refusals a user meets
// (BERT flags out of range, context parallelism, generation from a BERT checkpoint).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/sentence_corpus.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;

struct BertCli {
  TempDir dir;
  std::string m = cli_path().string();
  std::string common;
  BertCli() {
    const std::string tok = write_sentence_corpus(dir.path());
    common = tok + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32"
                   " --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4"
                   " --lr 1e-3 --log-interval 2 --eval-interval 2 --eval-iters 1 --split 90,10,0"
                   " --data-path '" + (dir / "corpus_text_sentence").string() + "'"
                   " --data-cache-path '" + (dir / "cache").string() + "'";
  }
};

TEST(PretrainBertCli, TrainsAndLogsMegatronsLosses) {
  BertCli c;
  auto r = run_command(c.m + " pretrain-bert" + c.common + " --train-iters 4 --save '" +
                       (c.dir / "ckpt").string() + "' --save-interval 4 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| lm loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| sop loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sop loss value: "), std::string::npos) << r.output;
  const auto meta = nlohmann::json::parse(read_file(c.dir / "ckpt" / "iter_0000004" / "metadata.json"));
  EXPECT_EQ(meta["args"]["model"]["model_family"], "bert");
  EXPECT_EQ(meta["args"]["model"]["attention_mask_type"], "bidirectional");
  EXPECT_EQ(meta["weights"]["lm_head.layer_norm.weight"]["init"], "ones");
  // Evaluating the checkpoint on the validation split (--skip-train, as pretrain_bert.py):
  // both losses, at the loaded iteration.
  r = run_command(c.m + " pretrain-bert" + c.common + " --train-iters 4 --load '" +
                  (c.dir / "ckpt").string() + "' --skip-train 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipping training (--skip-train is on) ..."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("iteration 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lm loss value: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sop loss value: "), std::string::npos) << r.output;
  // Generation needs a GPT: a clear error, not a model built wrong.
  r = run_command(c.m + " generate --use-checkpoint-args --load '" + (c.dir / "ckpt").string() +
                  "' --tokenizer-type BertWordPieceLowerCase --vocab-file '" +
                  (c.dir / "vocab.txt").string() + "' --prompt 'the cat' 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("pretrain-bert"), std::string::npos) << r.output;

  r = run_command(c.m + " pretrain-bert" + c.common + " --train-iters 2 --bert-no-binary-head 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| lm loss: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("sop loss"), std::string::npos) << r.output;
}

TEST(PretrainBertCli, RefusesWhatItCannotDo) {
  BertCli c;
  auto fails_with = [&](const std::string& extra, const std::string& what) {
    const auto r = run_command(c.m + " pretrain-bert" + c.common + " --train-iters 2" + extra + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << extra;
    EXPECT_NE(r.output.find(what), std::string::npos) << extra << ": " << r.output;
  };
  fails_with(" --mask-prob 1.5", "--mask-prob");
  fails_with(" --calculate-per-token-loss", "--calculate-per-token-loss");
  fails_with(" --mock-data", "--mock-data");
  fails_with(" --normalization RMSNorm", "LayerNorm");
}

}  // namespace
}  // namespace megatron::testing
