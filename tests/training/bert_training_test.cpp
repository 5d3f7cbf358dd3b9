// BERT pretraining (pretrain-bert: BertModel on Megatron's masked WordPiece samples) by parity with
// the single-rank run: a tiny BERT with the binary head trains in fp32 and follows the
// single-rank loss curve ("lm loss" and the sentence-order loss) within 1e-5 per iteration and
// ends with its parameters within 1e-5 of each tensor's scale:
//   np 2: TP2 + SP, PP2 (1F1B), DP2 with the distributed optimizer and overlapped reduction;
//   np 4: TP2 x PP2 + SP;
//   np 8: TP2 x PP2 x DP2 (SP, distributed optimizer, overlap).
// Also (one rank): the log names both losses as Megatron does, training lowers the masked-LM
// loss, save/resume continues the uninterrupted curve bit for bit, and what pretrain-bert refuses.
#include <gtest/gtest.h>

#include "dataset/bert_test_data.h"
#include "llama_test_util.h"
#include "parallel_test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// The tiny BERT: 2 layers, hidden 32, 4 heads, sequence 32, the 107-token test vocabulary padded
// to 128 under TP 1, 2 and 4, dropout 0, micro-batch 2, global batch 8.
struct BertFixture {
  SharedDir dir;
  BertFixture() {
    if (world()->rank() == 0) {
      testing::write_bert_vocab(dir / "vocab.txt");
      testing::SentenceDataOptions o;
      o.documents = 300;
      o.long_sentence_rate = 0;
      o.max_sentence_length = 12;
      testing::write_sentence_dataset(dir / "sentences", o);
    }
    world()->barrier();
  }
  TrainingArgs args(int64_t iters = 20, bool binary_head = true) const {
    TrainingArgs a = tiny_training_args(32, dir / "sentences", dir / "cache", iters);
    a.model.model_family = "bert";
    a.model.attention_mask_type = "bidirectional";
    a.model.bert_binary_head = binary_head;
    a.make_vocab_size_divisible_by = 32;
    a.tokenizer.type = "BertWordPieceLowerCase";
    a.tokenizer.vocab_file = dir / "vocab.txt";
    a.eval_interval = 10;
    return a;
  }
};

TEST(MpiBertTraining, LayoutsFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  BertFixture f;
  const int W = world()->size();
  const std::string ref_save = f.dir / "bert_ref";
  const TrainingSummary ref = reference_curve(f.args(), ref_save);
  ASSERT_EQ(ref.losses.size(), 20u);
  std::vector<Layout> layouts;
  if (W == 2)
    layouts = {{"tp2_sp", 2, 1, 0, 1, true},
               {"pp2", 1, 2},
               {"dp2_distopt_overlap", 1, 1, 0, 1, false, true, true}};
  else if (W == 4)
    layouts = {{"tp2_pp2_sp", 2, 2, 0, 1, true}};
  else if (W == 8)
    layouts = {{"tp2_pp2_dp2_sp_distopt_overlap", 2, 2, 0, 1, true, true, true}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs par = with_layout(f.args(), l);
    par.save = f.dir / ("bert_" + l.name);
    par.save_interval = 1000;
    const TrainingSummary p = pretrain(par);
    EXPECT_EQ(p.world_size, W);
    expect_same_curve(p, ref, 1e-5, l.name);
    ASSERT_EQ(p.more_losses.size(), ref.more_losses.size());
    for (size_t i = 0; i < ref.more_losses.size(); ++i)
      EXPECT_NEAR(p.more_losses[i].at(0), ref.more_losses[i].at(0),
                  1e-5 * std::abs(ref.more_losses[i].at(0)))
          << l.name << ": sop loss, iteration " << i + 1;
    if (world()->rank() == 0) expect_same_params(par.save, ref_save, 20, 1e-5);
    world()->barrier();
  }
}

TEST(BertTraining, LowersTheMaskedLmLossAndLogsBothLosses) {
  BertFixture f;
  TrainingArgs a = f.args(40);
  a.log_interval = 20;
  ::testing::internal::CaptureStdout();
  const TrainingSummary s = run_single(a);
  const std::string log = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(s.losses.size(), 40u);
  ASSERT_EQ(s.more_losses.size(), 40u);
  // The synthetic sentences are random words, so the masked-LM loss can only fall from uniform
  // over the padded vocabulary (ln 128 = 4.85) towards the words' unigram entropy.
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += s.losses[size_t(i)] / 5, last += s.losses[size_t(35 + i)] / 5;
  EXPECT_LT(last, first - 0.15) << "first 5: " << first << ", last 5: " << last;
  EXPECT_NE(log.find("| lm loss: "), std::string::npos) << log;
  EXPECT_NE(log.find("| sop loss: "), std::string::npos) << log;
  EXPECT_NE(log.find("lm loss value: "), std::string::npos) << log;
  EXPECT_NE(log.find("sop loss value: "), std::string::npos) << log;
}

TEST(BertTraining, WithoutBinaryHeadLogsOnlyTheLmLoss) {
  BertFixture f;
  TrainingArgs a = f.args(4, /*binary_head=*/false);
  a.log_interval = 2;
  ::testing::internal::CaptureStdout();
  const TrainingSummary s = run_single(a);
  const std::string log = ::testing::internal::GetCapturedStdout();
  for (const auto& more : s.more_losses) EXPECT_TRUE(more.empty());
  EXPECT_EQ(log.find("sop loss"), std::string::npos) << log;
  EXPECT_NE(log.find("| lm loss: "), std::string::npos) << log;
}

TEST(BertTraining, SaveAndResumeAreExact) {
  BertFixture f;
  expect_exact_resume(f.args(), f.dir / "full", f.dir / "resume", run_single);
}

TEST(BertTraining, RefusesWhatMegatronCannotTrain) {
  BertFixture f;
  auto message = [&](TrainingArgs a) {
    try {
      run_single(std::move(a));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TrainingArgs per_token = f.args(2);
  per_token.calculate_per_token_loss = true;
  EXPECT_NE(message(per_token).find("--calculate-per-token-loss"), std::string::npos);
  TrainingArgs causal = f.args(2);
  causal.model.attention_mask_type = "causal";
  EXPECT_NE(message(causal).find("bidirectional"), std::string::npos);
  TrainingArgs rms = f.args(2);
  rms.model.normalization = "RMSNorm";
  EXPECT_NE(message(rms).find("LayerNorm"), std::string::npos);
}

}  // namespace
}  // namespace megatron::training
