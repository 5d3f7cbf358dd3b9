// T5 pretraining (pretrain-t5: T5Model on --mock-data's synthetic span corruption) by parity with
// the single-rank run: a tiny T5 (2 encoder layers, 1 decoder layer, relative position bias) in
// fp32 follows the single-rank loss curve within 1e-5 per iteration and ends with its parameters
// within 1e-5 of each tensor's scale:
//   np 2: TP2 (the relative bias's heads split, its gradient summed over the group), TP2 with
//         sequence parallelism (the encoder's output sequence-sharded, gathered by every
//         cross-attention's linear_kv), and DP2 with the distributed optimizer and overlapped
//         reduction; with dropout, TP2 + SP alone and with full or selective recomputation;
//         bit-exact resume under TP2 + SP; pipeline and context parallelism refused by name;
//   np 4: TP2 x DP2, with and without sequence parallelism; with dropout, TP2 + SP x DP2 with
//         the distributed optimizer and full recomputation; bit-exact resume under it; the
//         refusals.
// Also (one rank): training lowers the loss, recomputation (full uniform / block, selective)
// leaves the losses within 1e-6, bf16 and fp16 train, save/resume continues the uninterrupted
// curve bit for bit, what pretrain-t5 refuses, and that the micro-batches of --data-path are
// make_t5_batch of Megatron's T5 dataset's samples.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "data/t5_dataset.h"
#include "dataset/bert_test_data.h"
#include "llama_test_util.h"
#include "parallel_test_util.h"
#include "training/training_data.h"

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
    layouts = {{"tp2", 2},
               {"tp2_sp", 2, 1, 0, 1, true},
               {"dp2_distopt_overlap", 1, 1, 0, 1, false, true, true}};
  else if (W == 4)
    layouts = {{"tp2_dp2_distopt", 2, 1, 0, 1, false, true},
               {"tp2_sp_dp2_distopt", 2, 1, 0, 1, true, true}};
  else if (W == 8)  // the 8-rank mix: TP2 + SP x DP4 with the distributed optimizer, overlapped
    layouts = {{"tp2_sp_dp4_distopt_overlap", 2, 1, 0, 1, true, true, true}};
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

TrainingArgs with_dropout(TrainingArgs a) {
  a.model.hidden_dropout = 0.1f;
  a.model.attention_dropout = 0.1f;
  return a;
}

// Dropout masks are functions of each element's place in the unsharded tensors, so sequence
// parallelism (and recomputing the layers under it) keeps the single-rank curve with dropout on.
TEST(MpiT5Training, SequenceParallelWithDropoutAndRecomputeFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  SharedDir dir;
  const std::string ref_save = dir / "t5_ref";
  const TrainingSummary ref = reference_curve(with_dropout(t5_args(dir.path(), 12)), ref_save);
  ASSERT_EQ(ref.losses.size(), 12u);
  std::vector<Layout> layouts;
  if (world()->size() == 2)
    layouts = {
        {"tp2_sp", 2, 1, 0, 1, true},
        {"tp2_sp_recompute_full", 2, 1, 0, 1, true, false, false, false, "p2p", "full"},
        {"tp2_sp_recompute_selective", 2, 1, 0, 1, true, false, false, false, "p2p",
         "selective"}};
  else if (world()->size() == 4)
    layouts = {{"tp2_sp_dp2_distopt_recompute_full", 2, 1, 0, 1, true, true, false, false,
                "p2p", "full"}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs par = with_layout(with_dropout(t5_args(dir.path(), 12)), l);
    par.save = dir / ("t5_" + l.name);
    par.save_interval = 1000;
    const TrainingSummary p = pretrain(par);
    expect_same_curve(p, ref, 1e-5, l.name);
    if (world()->rank() == 0) expect_same_params(par.save, ref_save, 12, 1e-5);
    world()->barrier();
  }
}

TEST(MpiT5Training, SaveAndResumeAreExactUnderSequenceParallelism) {
  SKIP_ON_ONE_RANK();
  SharedDir dir;
  // TP2 + SP, and at np 4 also DP2 with the distributed optimizer.
  const TrainingArgs a = with_layout(with_dropout(t5_args(dir.path())),
                                     Layout{"tp2_sp", 2, 1, 0, 1, true, world()->size() > 2});
  expect_exact_resume(a, dir / "full", dir / "resume",
                      [](const TrainingArgs& args) { return pretrain(args); });
}

// Megatron-LM trains T5 with neither pipeline nor context parallelism: both are refused with
// errors that say so and name what is supported.
TEST(MpiT5Training, RefusesPipelineAndContextParallelism) {
  SKIP_ON_ONE_RANK();
  SharedDir dir;
  auto message = [&](const Layout& l) {
    try {
      pretrain(with_layout(t5_args(dir.path(), 2), l));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string pp = message(Layout{"pp2", 1, 2});
  EXPECT_NE(pp.find("Pipeline parallelism is not supported for T5."), std::string::npos) << pp;
  EXPECT_NE(pp.find("--tensor-model-parallel-size"), std::string::npos) << pp;
  const std::string cp = message(Layout{"cp2", 1, 1, 0, 2});
  EXPECT_NE(cp.find("--context-parallel-size 2: T5 trains without context parallelism"),
            std::string::npos) << cp;
  world()->barrier();
}

TEST(T5Training, RecomputationKeepsTheLosses) {
  SharedDir dir;
  const TrainingSummary plain = run_single(with_dropout(t5_args(dir.path(), 6)));
  struct Case {
    const char* name;
    std::string granularity, method;
    int layers;
  };
  const std::vector<Case> cases = {{"full uniform 1", "full", "uniform", 1},
                                   {"full uniform 2", "full", "uniform", 2},
                                   {"full block 1", "full", "block", 1},
                                   {"selective", "selective", "", 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TrainingArgs a = with_dropout(t5_args(dir.path(), 6));
    a.model.recompute_granularity = c.granularity;
    a.model.recompute_method = c.method;
    a.model.recompute_num_layers = c.layers;
    const TrainingSummary r = run_single(a);
    ASSERT_EQ(r.losses.size(), plain.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i)
      EXPECT_NEAR(r.losses[i], plain.losses[i], 1e-6) << "iteration " << i + 1;
  }
}

// bf16 (bf16 weights, bf16 products with fp32 accumulation) and fp16 (dynamic loss scaling)
// train the tiny T5 as fp32 does: the same first loss up to the precision's rounding, and the
// loss falls as far.
TEST(T5Training, HalfPrecisionTrains) {
  SharedDir dir;
  const TrainingSummary fp32 = run_single(t5_args(dir.path(), 40));
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    TrainingArgs a = t5_args(dir.path(), 40);
    a.bf16 = bf16;
    a.fp16 = !bf16;
    const TrainingSummary s = run_single(a);
    ASSERT_EQ(s.losses.size(), 40u);
    EXPECT_NEAR(s.losses[0], fp32.losses[0], 2e-2);
    double last = 0, last32 = 0;
    for (int i = 35; i < 40; ++i) {
      EXPECT_TRUE(std::isfinite(s.losses[size_t(i)])) << i;
      last += s.losses[size_t(i)] / 5;
      last32 += fp32.losses[size_t(i)] / 5;
    }
    EXPECT_LT(last, s.losses[0] - 0.5);
    EXPECT_NEAR(last, last32, 0.1);
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

void expect_same_tensor(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_TRUE(got.is_contiguous() && want.is_contiguous()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0) << what;
}

TEST(T5Training, MicroBatchesAreMegatronsSamples) {
  SharedDir dir;
  testing::write_bert_vocab(dir / "vocab.txt");
  testing::SentenceDataOptions o;
  o.documents = 120;
  o.long_sentence_rate = 0;
  o.max_sentence_length = 12;
  testing::write_sentence_dataset(dir / "sentences", o);
  TrainingArgs a = tiny_training_args(32, dir / "sentences", dir / "cache", 4);
  a.model.model_family = "t5";
  a.model.decoder_seq_length = 16;
  a.tokenizer.type = "BertWordPieceLowerCase";
  a.tokenizer.vocab_file = dir / "vocab.txt";
  a.tokenizer.vocab_extra_ids = 20;
  const auto tokenizer = data::build_tokenizer(a.tokenizer);
  const std::array<int64_t, 3> n = {16, 4, 0};
  const auto training = build_training_data(a, *tokenizer, n);
  const data::T5Datasets ds = data::build_t5_datasets(t5_data_config(a, *tokenizer), n);
  ASSERT_EQ(training->size(DataSplit::train), ds.train->size());
  ASSERT_EQ(training->size(DataSplit::valid), ds.valid->size());
  EXPECT_FALSE(training->has(DataSplit::test));
  // The second data-parallel rank's micro-batch of the block at sample 4: samples 6 and 7.
  const model::Batch got = training->micro_batch(DataSplit::train, 4, 2, 1, 2);
  const std::vector<int64_t> ids = {6, 7};
  const data::T5Batch want = data::make_t5_batch(*ds.train, ids);
  expect_same_tensor(got.encoder_tokens, want.tokens_enc, "encoder tokens");
  expect_same_tensor(got.encoder_padding_mask, want.enc_mask, "encoder padding mask");
  expect_same_tensor(got.tokens, want.tokens_dec, "decoder tokens");
  expect_same_tensor(got.labels, want.labels, "labels");
  expect_same_tensor(got.loss_mask, want.loss_mask, "loss mask");
  // The encoder mask is 1 exactly over the sample's text (ids other than [PAD] 0).
  const data::T5Sample s = ds.train->sample(6);
  for (size_t i = 0; i < s.text_enc.size(); ++i) EXPECT_EQ(s.enc_mask[i], s.text_enc[i] != 0 ? 1 : 0) << i;
  const model::Batch valid = training->micro_batch(DataSplit::valid, 0, 2, 0, 1);
  expect_same_tensor(valid.encoder_tokens, data::make_t5_batch(*ds.valid, std::vector<int64_t>{0, 1}).tokens_enc,
                     "validation encoder tokens");
}

}  // namespace
}  // namespace megatron::training
