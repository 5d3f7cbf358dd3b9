// Batch-size ramp-up and step schedules (Megatron's num_microbatches_calculator.py and
// update_train_iters), their use by the trainer (iterations, consumed samples, LR steps in
// samples, exact resume from a checkpoint taken mid-ramp), --decoupled-lr (the embedding and
// output layer's own LR; the position embedding keeps the main one), --skip-train and --mock-data
// runs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "test_util.h"
#include "parallel_test_util.h"
#include "training/batch_size_schedule.h"
#include "training/trainer.h"

namespace megatron::training {
namespace {

template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BatchSizeSchedule, RampupAtTheBoundaries) {
  // 2 2 16, global 8: per increment 16 / 3 samples = 5.33; int(c / 5.33) increments until c > 16.
  const auto r = BatchSizeSchedule::rampup(2, 2, 16, 8);
  const std::vector<std::pair<int64_t, int64_t>> table = {
      {0, 2}, {5, 2}, {6, 4}, {10, 4}, {11, 6}, {15, 6}, {16, 8}, {17, 8}, {1000, 8}};
  for (auto [c, b] : table) EXPECT_EQ(r.global_batch_size(c), b) << "consumed " << c;
  // Python's float division: 9 / (9 / 7) = 6.999..., so at exactly the ramp-up samples Megatron
  // is one increment short of the global batch (an exact integer formula would give 8).
  const auto q = BatchSizeSchedule::rampup(1, 1, 9, 8);
  EXPECT_EQ(q.global_batch_size(9), 7);
  EXPECT_EQ(q.global_batch_size(10), 8);
  // update_train_iters: batches 2 2 2 4 4 6 (20 samples, the ramp-up loop runs while c <= 16),
  // then (40 - 20) // 8 = 2 more; a partial last batch is dropped.
  EXPECT_EQ(r.train_iters_for_samples(40), 8);
  EXPECT_EQ(r.train_iters_for_samples(43), 8);
  EXPECT_EQ(r.train_iters_for_samples(44), 9);
  EXPECT_EQ(BatchSizeSchedule::constant(8).train_iters_for_samples(47), 5);
}

TEST(BatchSizeSchedule, RampupErrorsAreMegatrons) {
  expect_error([] { BatchSizeSchedule::rampup(2, 4, 16, 8); },
               "global batch size interval (6 = --global-batch-size 8 - start 2) must be divisible "
               "by the batch size increment (4)");
  expect_error([] { BatchSizeSchedule::rampup(16, 2, 16, 8); }, "greater than or equal to the start");
  expect_error([] { BatchSizeSchedule::rampup(8, 2, 16, 8); }, "nothing to ramp up");
  expect_error([] { BatchSizeSchedule::rampup(0, 2, 16, 8); }, "start batch size should be positive");
  // Every batch of the run must split into micro-batch x DP: 3 does not split into 2 x 1.
  const auto r = BatchSizeSchedule::rampup(3, 1, 10, 6);
  expect_error([&] { r.validate_against(0, 0, 5, 2, 1, 1); },
               "--rampup-batch-size: the global batch size of iteration 1 (3, after 0 consumed "
               "samples) is not divisible by --micro-batch-size (2) times data parallel size (1)");
  // Resumed past the ramp-up, only the final batch is checked.
  EXPECT_NO_THROW(r.validate_against(100, 20, 25, 2, 1, 1));
}

TEST(BatchSizeSchedule, StepScheduleInTokens) {
  // Thresholds are tokens // seq-length: 1.5K / 16 = 93 samples, 4K / 16 = 250.
  const auto s = BatchSizeSchedule::step("0:2 1.5k:4,4K:8", 16);
  EXPECT_EQ(s.final_global_batch_size(), 8);
  ASSERT_EQ(s.steps().size(), 3u);
  EXPECT_EQ(s.steps()[1], (std::pair<int64_t, int64_t>{93, 4}));
  EXPECT_EQ(s.global_batch_size(92), 2);
  EXPECT_EQ(s.global_batch_size(93), 4);
  EXPECT_EQ(s.global_batch_size(249), 4);
  EXPECT_EQ(s.global_batch_size(250), 8);
  // Iterations while a whole batch fits: 2 x 47 = 94 (>= 93), then 4s up to 250, then 8s.
  EXPECT_EQ(s.train_iters_for_samples(94), 47);
  EXPECT_EQ(s.train_iters_for_samples(94 + 156), 47 + 39);
  expect_error([] { BatchSizeSchedule::step("16:2 64:4", 16); }, "first entry must have threshold 0, got 1");
  expect_error([] { BatchSizeSchedule::step("0:2 8:4", 16); }, "strictly increasing, got 0 before 0");
  expect_error([] { BatchSizeSchedule::step("0:2 64-4", 16); }, "invalid schedule entry \"64-4\"");
  expect_error([] { BatchSizeSchedule::step("0:x", 16); }, "is not THRESHOLD:BATCH_SIZE");
}

// The training tests' tiny GPT (parallel_test_util.h) on its corpus in `dir`, with dropout,
// a batch-size ramp-up from 2 by 2 over 16 samples to 8, 40 samples, a warmup of 6 samples,
// logging every iteration and evaluation every 4.
TrainingArgs tiny(const testing::TempDir& dir) {
  parallel_test::write_corpus((dir / "corpus").string());
  TrainingArgs a = parallel_test::tiny_gpt_args(dir.path(), 0);
  a.model.hidden_dropout = 0.1f;
  a.model.attention_dropout = 0.1f;
  a.rampup_batch_size = {2, 2, 16};
  a.train_samples = 40;
  a.lr_warmup_iters = 0;
  a.lr_warmup_samples = 6;
  a.log_interval = 1;
  a.eval_interval = 4;
  return a;
}

std::vector<std::string> jsonl_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

double field(const std::string& line, const std::string& key) {
  const size_t p = line.find("\"" + key + "\": ");
  EXPECT_NE(p, std::string::npos) << key << " in " << line;
  return std::stod(line.substr(p + key.size() + 4));
}

TEST(BatchSizeRampup, TrainsWithMegatronsBatchesAndResumesMidRampBitForBit) {
  testing::TempDir dir;
  TrainingArgs a = tiny(dir);
  a.micro_batch_size = 2;  // 2 4 6 8 all split into micro-batches of 2
  a.metrics_jsonl = (dir / "full.jsonl").string();
  const TrainingSummary full = pretrain(a);
  EXPECT_EQ(full.iterations, 8);
  EXPECT_EQ(full.consumed_samples, 2 + 2 + 2 + 4 + 4 + 6 + 8 + 8);
  const auto lines = jsonl_lines(dir / "full.jsonl");
  ASSERT_EQ(lines.size(), 8u);
  const int64_t consumed[8] = {2, 4, 6, 10, 14, 20, 28, 36};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(field(lines[i], "consumed_samples"), double(consumed[i])) << lines[i];
  // The LR schedule counts samples: warmup over 6 samples from 0, cosine decay to 3e-4 over 40.
  // The logged LR is Megatron's: the scheduler's after the iteration's step (consumed[i] samples).
  EXPECT_NEAR(field(lines[0], "learning_rate"), 3e-3 * 2 / 6, 1e-15);
  EXPECT_NEAR(field(lines[1], "learning_rate"), 3e-3 * 4 / 6, 1e-15);
  EXPECT_NEAR(field(lines[2], "learning_rate"),
              3e-4 + 0.5 * (std::cos(M_PI * (6.0 - 6.0) / 34.0) + 1) * (3e-3 - 3e-4), 1e-15);
  EXPECT_NEAR(field(lines[4], "learning_rate"),
              3e-4 + 0.5 * (std::cos(M_PI * (14.0 - 6.0) / 34.0) + 1) * (3e-3 - 3e-4), 1e-12);

  // Stop after iteration 4 (10 consumed samples, mid-ramp), save, resume to the end.
  testing::TempDir dir2;
  TrainingArgs b = a;
  b.metrics_jsonl.clear();
  b.save = (dir2 / "ckpt").string();
  b.save_interval = 100;
  b.exit_interval = 4;
  const TrainingSummary first = pretrain(b);
  EXPECT_EQ(first.iterations, 4);
  EXPECT_EQ(first.consumed_samples, 10);
  // Megatron saves before the number of micro-batches changes: after iteration 3 (2 -> 4).
  EXPECT_TRUE(std::filesystem::exists(dir2 / "ckpt" / "iter_0000003"));
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = pretrain(b);
  EXPECT_EQ(second.start_iteration, 4);
  EXPECT_EQ(second.iterations, 8);
  EXPECT_EQ(second.consumed_samples, full.consumed_samples);
  ASSERT_EQ(first.losses.size() + second.losses.size(), full.losses.size());
  for (size_t i = 0; i < full.losses.size(); ++i) {
    const double got = i < 4 ? first.losses[i] : second.losses[i - 4];
    EXPECT_EQ(got, full.losses[i]) << "iteration " << i + 1;  // bitwise
  }
  EXPECT_TRUE(std::filesystem::exists(dir2 / "ckpt" / "iter_0000005"));  // 4 -> 6 before iteration 6
  EXPECT_TRUE(std::filesystem::exists(dir2 / "ckpt" / "iter_0000006"));  // 6 -> 8 before iteration 7
}

// A constant batch with --train-samples: Megatron's train_samples // global_batch_size
// iterations (10 samples of batches of 4: 2 iterations, not 3); less than one batch is an error.
TEST(BatchSizeRampup, ConstantBatchTrainSamplesDropThePartialLastBatch) {
  testing::TempDir dir;
  TrainingArgs a = tiny(dir);
  a.rampup_batch_size.clear();
  a.global_batch_size = 4;
  a.train_samples = 10;
  const TrainingSummary s = pretrain(a);
  EXPECT_EQ(s.iterations, 2);
  EXPECT_EQ(s.consumed_samples, 8);
  a.train_samples = 3;
  expect_error([&] { pretrain(a); }, "--train-samples 3 is less than one global batch (4 samples)");
}

TEST(BatchSizeRampup, StepScheduleTrainsItsBatches) {
  testing::TempDir dir;
  TrainingArgs a = tiny(dir);
  a.rampup_batch_size.clear();
  a.global_batch_size = 0;
  a.step_batch_size_schedule = "0:2 96:4 160:8";  // tokens: 6 and 10 samples of 16 tokens
  a.train_samples = 30;
  a.metrics_jsonl = (dir / "m.jsonl").string();
  const TrainingSummary s = pretrain(a);
  // 2 2 2 (6) 4 (10) 8 8 (26): a third 8 would pass 30.
  EXPECT_EQ(s.iterations, 6);
  EXPECT_EQ(s.consumed_samples, 26);
  const auto lines = jsonl_lines(dir / "m.jsonl");
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(field(lines[3], "consumed_samples"), 10.0);
  EXPECT_EQ(field(lines[4], "consumed_samples"), 18.0);
}

// Reads one tensor of a saved checkpoint (single rank).
Tensor saved(const std::filesystem::path& ckpt, const std::string& iter, const std::string& name) {
  return read_safetensors(ckpt / iter / "mp_rank_00" / "model.safetensors").tensors.at(name);
}

bool same(const Tensor& x, const Tensor& y) {
  if (x.numel() != y.numel()) return false;
  const Tensor a = x.to(DType::F32), b = y.to(DType::F32);
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data<float>()[i] != b.data<float>()[i]) return false;
  return true;
}

TEST(DecoupledLR, EmbeddingAndOutputLayerTakeTheirOwnSchedule) {
  testing::TempDir dir;
  TrainingArgs a = tiny(dir);
  a.rampup_batch_size.clear();
  a.global_batch_size = 4;
  a.train_samples = 0;
  a.train_iters = 3;
  a.lr_warmup_samples = 0;
  a.lr_warmup_iters = 1;
  a.model.position_embedding_type = "learned_absolute";
  a.model.untie_embeddings_and_output_weights = true;
  a.save_interval = 3;
  auto run = [&](const std::string& name, std::optional<double> dec, std::optional<double> dec_min) {
    TrainingArgs b = a;
    b.save = (dir / name).string();
    b.decoupled_lr = dec;
    b.decoupled_min_lr = dec_min;
    return pretrain(b);
  };
  const TrainingSummary plain = run("plain", std::nullopt, std::nullopt);
  // The decoupled group with the main LR's values is the plain run, bit for bit.
  const TrainingSummary same_lr = run("same", 3e-3, 3e-4);
  EXPECT_EQ(plain.losses, same_lr.losses);
  // Decoupled LR 0: the word embedding and the output layer stay at their initial values; the
  // position embedding (not in Megatron's group) and the layers train.
  run("frozen", 0.0, 0.0);
  {  // the initial weights: the same seed, one iteration at LR 0
    TrainingArgs b = a;
    b.train_iters = 1;
    b.lr = b.min_lr = 0;
    b.lr_warmup_iters = 0;
    b.save = (dir / "init").string();
    b.save_interval = 1;
    pretrain(b);
  }
  auto init = [&](const std::string& n) { return saved(dir / "init", "iter_0000001", n); };
  for (const char* n : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    EXPECT_TRUE(same(saved(dir / "frozen", "iter_0000003", n), init(n))) << n;
    EXPECT_FALSE(same(saved(dir / "plain", "iter_0000003", n), init(n))) << n;
  }
  for (const char* n : {"embedding.position_embeddings.weight", "decoder.final_layernorm.weight"})
    EXPECT_FALSE(same(saved(dir / "frozen", "iter_0000003", n), init(n))) << n;
}

TEST(DecoupledLR, ResumeKeepsTheDecoupledSchedule) {
  testing::TempDir dir;
  TrainingArgs a = tiny(dir);
  a.decoupled_lr = 1e-2;
  a.decoupled_min_lr = 1e-3;
  const TrainingSummary full = pretrain(a);
  TrainingArgs b = a;
  b.save = (dir / "ckpt").string();
  b.save_interval = 100;
  b.exit_interval = 5;
  const TrainingSummary first = pretrain(b);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = pretrain(b);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, full.losses);
  const std::string meta = testing::read_file(dir / "ckpt" / "iter_0000005" / "metadata.json");
  EXPECT_NE(meta.find("\"decoupled_lr\": 0.01"), std::string::npos) << meta;
  // A resume with another decoupled LR is refused unless the schedule is overridden.
  b.decoupled_lr = 2e-2;
  expect_error([&] { pretrain(b); }, "--decoupled-lr: the checkpoint's LR schedule has 0.01");
}

TEST(SkipTrain, EvaluatesValidationAndTestAtTheLoadedIteration) {
  testing::TempDir dir;
  TrainingArgs a = tiny(dir);
  a.data.split = "80,10,10";
  a.rampup_batch_size.clear();
  a.train_samples = 0;
  a.train_iters = 4;
  a.lr_warmup_samples = 0;
  a.global_batch_size = 4;
  a.save = (dir / "ckpt").string();
  a.save_interval = 4;
  pretrain(a);
  TrainingArgs e = a;
  e.load = a.save;
  e.save.clear();
  e.skip_train = true;
  e.train_iters = 0;
  e.eval_iters = 2;
  const TrainingSummary s = pretrain(e);
  EXPECT_EQ(s.iterations, 4);
  EXPECT_EQ(s.start_iteration, 4);
  ASSERT_EQ(s.valid_losses.size(), 1u);
  EXPECT_TRUE(std::isfinite(s.test_loss));
  EXPECT_NE(s.valid_losses[0], s.test_loss);
  // Evaluating twice gives the same numbers (the validation split from its first sample).
  const TrainingSummary again = pretrain(e);
  EXPECT_EQ(again.valid_losses, s.valid_losses);
  EXPECT_EQ(again.test_loss, s.test_loss);
  e.eval_iters = 0;
  expect_error([&] { pretrain(e); }, "--skip-train: nothing to evaluate: --eval-iters is 0");
}

TEST(MockData, TrainsWithoutDataFiles) {
  TrainingArgs a;
  a.model.num_layers = 1;
  a.model.hidden_size = 16;
  a.model.num_attention_heads = 2;
  a.model.seq_length = 32;
  a.model.max_position_embeddings = 32;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = 4096;
  a.mock_data = true;
  a.micro_batch_size = 2;
  a.global_batch_size = 4;
  a.train_iters = 6;
  a.lr = 1e-3;
  a.eval_interval = 3;
  a.eval_iters = 1;
  a.log_interval = 3;
  const TrainingSummary s = pretrain(a);
  EXPECT_EQ(s.iterations, 6);
  EXPECT_EQ(s.valid_losses.size(), 3u);  // iterations 3 and 6, then the end of training
  // The mock documents count up 1, 2, 3, ...: the next token is easy to predict.
  EXPECT_LT(s.losses.back(), s.losses.front());
}

}  // namespace
}  // namespace megatron::training
