// T5 pretraining (pretrain-t5: T5Model on --mock-data's synthetic span corruption) by parity with
// the single-rank run: a tiny T5 (2 encoder layers, 1 decoder layer, relative position bias) in
// fp32 follows the single-rank loss curve within 1e-5 per iteration and ends with its parameters
// within 1e-5 of each tensor's scale:
//   np 2: TP2 (the relative bias's heads split, its gradient summed over the group), and DP2 with
//         the distributed optimizer and overlapped reduction;
//   np 4: TP2 x DP2.
// Also (one rank): training lowers the loss, save/resume continues the uninterrupted curve bit
// for bit, and what pretrain-t5 refuses.
#include <gtest/gtest.h>

#include "llama_test_util.h"
#include "parallel_test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

TrainingArgs t5_args(const fs::path& dir, int64_t iters = 20) {
  TrainingArgs a = tiny_gpt_args(dir, iters);
  a.data.data_path.clear();
  a.mock_data = true;
  a.model.model_family = "t5";
  a.model.num_layers = 2;
  a.model.decoder_num_layers = 1;
  a.model.seq_length = 24;
  a.model.decoder_seq_length = 12;
  a.model.max_position_embeddings = 24;
  a.model.position_embedding_type = "relative";
  a.tokenizer.vocab_size = 120;
  a.tokenizer.vocab_extra_ids = 20;
  a.eval_interval = 10;
  return a;
}

TEST(MpiT5Training, LayoutsFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  SharedDir dir;
  const int W = world()->size();
  const std::string ref_save = dir / "t5_ref";
  const TrainingSummary ref = reference_curve(t5_args(dir.path()), ref_save);
  ASSERT_EQ(ref.losses.size(), 20u);
  std::vector<Layout> layouts;
  if (W == 2)
    layouts = {{"tp2", 2}, {"dp2_distopt_overlap", 1, 1, 0, 1, false, true, true}};
  else if (W == 4)
    layouts = {{"tp2_dp2_distopt", 2, 1, 0, 1, false, true}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs par = with_layout(t5_args(dir.path()), l);
    par.save = dir / ("t5_" + l.name);
    par.save_interval = 1000;
    const TrainingSummary p = pretrain(par);
    EXPECT_EQ(p.world_size, W);
    expect_same_curve(p, ref, 1e-5, l.name);
    if (world()->rank() == 0) expect_same_params(par.save, ref_save, 20, 1e-5);
    world()->barrier();
  }
}

TEST(T5Training, LowersTheLossOnMockSpanCorruption) {
  SharedDir dir;
  TrainingArgs a = t5_args(dir.path(), 40);
  const TrainingSummary s = run_single(a);
  ASSERT_EQ(s.losses.size(), 40u);
  // The spans are arithmetic progressions: predictable from their context, so the loss falls
  // well below uniform over the padded vocabulary (ln 128 = 4.85).
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += s.losses[size_t(i)] / 5;
    last += s.losses[size_t(35 + i)] / 5;
  }
  EXPECT_LT(last, first - 0.5) << "first 5: " << first << ", last 5: " << last;
}

TEST(T5Training, SaveAndResumeAreExact) {
  SharedDir dir;
  expect_exact_resume(t5_args(dir.path()), dir.path(), 10);
}

TEST(T5Training, RefusesWhatItDoesNotSupport) {
  SharedDir dir;
  auto message = [&](TrainingArgs a) {
    try {
      run_single(std::move(a));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TrainingArgs files = t5_args(dir.path(), 2);
  files.mock_data = false;
  files.data.data_path = {dir / "corpus"};
  // Megatron's T5 dataset reads WordPiece data: the test's tokenizer is not one.
  EXPECT_NE(message(files).find("WordPiece tokenizer"), std::string::npos) << message(files);
  TrainingArgs no_sentinels = t5_args(dir.path(), 2);
  no_sentinels.tokenizer.vocab_extra_ids = 0;
  EXPECT_NE(message(no_sentinels).find("--vocab-extra-ids"), std::string::npos);
  TrainingArgs gqa = t5_args(dir.path(), 2);
  gqa.model.num_query_groups = 2;
  EXPECT_NE(message(gqa).find("--num-query-groups"), std::string::npos);
}

}  // namespace
}  // namespace megatron::training
