// Trainer and pretrain-gpt tests: FLOPs formula against hand computation, argument validation
// errors, and end-to-end training of a tiny GPT on a dataset written by IndexedDatasetBuilder
// (loss goes down, the run is deterministic, log lines have Megatron's fields).
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "core/error.h"
#include "parallel_test_util.h"
#include "data/indexed_dataset.h"
#include "test_util.h"
#include "training/metrics.h"
#include "training/trainer.h"

namespace megatron::training {
namespace {

TEST(Metrics, FlopsFormulaByHand) {
  FlopsModel m{2, 8, 2, 0, 0, 0, 4, 16, false};
  // B=3, s=4, h=8, F=32, q=kv=8, L=2, V=16:
  // B*s*(6*8*32*2*2 + 6*2*(8*(8+16) + 64) + 6*8*16) + B*s*s*6*8*2
  const double expected = 12.0 * (6144 + 3072 + 768) + 48.0 * 96;
  EXPECT_DOUBLE_EQ(flops_per_iteration(m, 3), expected);
  // Equivalent closed form from the spec.
  const double closed = 12.0 * 3 * 4 * 2 * 64 * ((1 + 1 + 4.0 / 16) * 1 + 4 * 1) + 6.0 * 3 * 4 * 8 * 16;
  EXPECT_DOUBLE_EQ(flops_per_iteration(m, 3), closed);
}

TEST(Metrics, LogLineFields) {
  IntervalStats s;
  s.iteration = 10;
  s.train_iters = 100;
  s.consumed_samples = 80;
  s.elapsed_ms_per_iter = 12.34;
  s.learning_rate = 1.5e-4;
  s.global_batch_size = 8;
  s.lm_loss = 3.25;
  s.loss_scale = 1.0;
  s.grad_norm = 0.5;
  const std::string line = format_log_line(s);
  EXPECT_TRUE(std::regex_search(line, std::regex(R"(^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration       10/     100 \| consumed samples:           80 \| elapsed time per iteration \(ms\): 12\.3 \|)"))) << line;
  EXPECT_NE(line.find("learning rate: 1.500000E-04 | global batch size:     8 | lm loss: 3.250000E+00 | loss scale: 1.0 | grad norm: 0.500 | number of skipped iterations:   0 | number of nan iterations:   0 |"), std::string::npos) << line;
  EXPECT_NE(format_validation_line(5, 2.0).find("lm loss PPL: 7.389056E+00"), std::string::npos);
}

std::string write_corpus(const testing::TempDir& dir) {
  const std::string prefix = (dir / "corpus").string();
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  // Documents with a learnable pattern: arithmetic sequences mod 60, EOD = 63.
  for (int d = 0; d < 200; ++d) {
    std::vector<int32_t> doc;
    const int step = 1 + d % 5;
    for (int i = 0; i < 40; ++i) doc.push_back((d + i * step) % 60);
    doc.push_back(63);
    b.add_item(doc);
    b.end_document();
  }
  b.finalize();
  return prefix;
}

TrainingArgs tiny_args(const std::string& prefix, const std::string& cache) {
  TrainingArgs a = parallel_test::tiny_training_args(16, prefix, cache, 120);
  a.model.hidden_dropout = 0.1f;
  a.model.attention_dropout = 0.1f;
  a.make_vocab_size_divisible_by = 8;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = 64;
  a.global_batch_size = 4;
  a.log_interval = 40;
  a.eval_interval = 60;
  a.eval_iters = 2;
  return a;
}

TEST(Trainer, TinyGPTLearnsAndIsDeterministic) {
  testing::TempDir dir;
  const std::string prefix = write_corpus(dir);
  TrainingArgs a = tiny_args(prefix, (dir / "cache").string());
  TrainingSummary s1 = pretrain(a);
  EXPECT_EQ(s1.iterations, 120);
  EXPECT_EQ(s1.consumed_samples, 480);
  EXPECT_LT(s1.last_loss, std::log(64.0) - 0.5);  // well below uniform over the vocabulary
  TrainingSummary s2 = pretrain(a);
  EXPECT_EQ(s1.last_loss, s2.last_loss);  // bitwise: same data order, dropout keys, init
  a.exit_interval = 7;
  EXPECT_EQ(pretrain(a).iterations, 7);
}

TEST(Trainer, ArgumentErrors) {
  testing::TempDir dir;
  const TrainingArgs good = tiny_args("x", "");
  auto expect_error = [&](auto mutate, const std::string& needle) {
    TrainingArgs a = good;
    mutate(a);
    try {
      validate_args(a);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EXPECT_NO_THROW(validate_args(good));
  expect_error([](TrainingArgs& a) { a.global_batch_size = 5; }, "--global-batch-size");
  expect_error([](TrainingArgs& a) { a.model.hidden_size = 30; }, "--num-attention-heads");
  expect_error([](TrainingArgs& a) { a.model.max_position_embeddings = 8; }, "--max-position-embeddings");
  expect_error([](TrainingArgs& a) { a.fp16 = a.bf16 = true; }, "mutually exclusive");
  expect_error([](TrainingArgs& a) { a.train_samples = 100; }, "exactly one");
  expect_error([](TrainingArgs& a) { a.train_iters = 0; }, "exactly one");
  expect_error([](TrainingArgs& a) { a.lr_warmup_fraction = 0.1; }, "--lr-warmup-fraction");
  expect_error([](TrainingArgs& a) { a.lr_warmup_samples = 10; }, "--lr-warmup-samples");
  expect_error([](TrainingArgs& a) { a.min_lr = 1.0; }, "--min-lr");
  expect_error([](TrainingArgs& a) { a.micro_batch_size = 0; }, "--micro-batch-size");
}

TEST(PretrainGptCli, TrainsAndRejectsBadFlags) {
  testing::TempDir dir;
  const std::string prefix = write_corpus(dir);
  const std::string common =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
      "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --tokenizer-type NullTokenizer "
      "--vocab-size 64 --make-vocab-size-divisible-by 8 --data-path " + prefix +
      " --data-cache-path " + (dir / "cache").string() + " --split 90,10,0 --log-interval 2 --eval-iters 1";
  auto ok = testing::run_cli(common + " --train-iters 4 --log-metrics-jsonl " + (dir / "m.jsonl").string());
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("iteration        4/       4 |"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("validation loss at iteration 4"), std::string::npos) << ok.output;
  EXPECT_NE(testing::read_file(dir / "m.jsonl").find("\"iteration\": 4"), std::string::npos);
  auto bad = testing::run_cli(common + " --train-iters 4 --tensor-model-parallel-size 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("world size 1 is not divisible by --tensor-model-parallel-size 2"),
            std::string::npos) << bad.output;
  auto unknown = testing::run_cli(common + " --train-iters 4 --no-such-flag");
  EXPECT_NE(unknown.exit_code, 0);
  // Megatron's CP exchange flag: p2p (the default) and allgather exist; the head all-to-all not.
  auto cp = testing::run_cli(common + " --train-iters 4 --cp-comm-type a2a");
  EXPECT_EQ(cp.exit_code, 1) << cp.output;
  EXPECT_NE(cp.output.find("--cp-comm-type a2a (the all-to-all of attention heads) is not "
                           "implemented"), std::string::npos) << cp.output;
  EXPECT_EQ(testing::run_cli(common + " --train-iters 1 --cp-comm-type allgather").exit_code, 0);
  EXPECT_EQ(testing::run_cli(common + " --train-iters 1 --cp-comm-type p2p").exit_code, 0);
  auto decay = testing::run_cli(common + " --train-iters 4 --lr-decay-style cosin");
  EXPECT_NE(decay.output.find("--lr-decay-style"), std::string::npos) << decay.output;
}

}  // namespace
}  // namespace megatron::training

namespace megatron::training {
namespace {

// --save writes DIR/iter_NNNNNNN/mp_rank_00/model.safetensors + metadata.json and the tracker;
// `megatron generate --load` reads it back.
TEST(Checkpoint, SaveLayoutPermissionsAndGenerateLoads) {
  testing::TempDir dir;
  const std::string prefix = write_corpus(dir);
  const std::string ckpt = (dir / "ckpt").string();
  const std::string model = "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
                            "--max-position-embeddings 16 --tokenizer-type NullTokenizer "
                            "--vocab-size 64 --make-vocab-size-divisible-by 8 --openai-gelu ";
  auto nosave = testing::run_cli("pretrain-gpt " + model + "--micro-batch-size 2 --lr 1e-3 --train-iters 4 "
                                 "--data-path " + prefix + " --save " + ckpt);
  EXPECT_NE(nosave.output.find("--save-interval"), std::string::npos) << nosave.output;
  auto r = testing::run_cli("pretrain-gpt " + model + "--micro-batch-size 2 --lr 1e-3 --train-iters 5 "
                            "--data-path " + prefix + " --data-cache-path " + (dir / "cache").string() +
                            " --split 90,10,0 --save " + ckpt + " --save-interval 2 --log-interval 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  namespace fs = std::filesystem;
  for (const char* it : {"iter_0000002", "iter_0000004", "iter_0000005"}) {
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / it / "mp_rank_00" / "model.safetensors")) << it;
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / it / "metadata.json")) << it;
  }
  EXPECT_EQ(testing::read_file(fs::path(ckpt) / "latest_checkpointed_iteration.txt"), "5");
  const auto st = fs::status(fs::path(ckpt) / "iter_0000005" / "mp_rank_00" / "model.safetensors");
  EXPECT_EQ(st.permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  const auto dst = fs::status(fs::path(ckpt) / "iter_0000005");
  EXPECT_EQ(dst.permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  const std::string meta = testing::read_file(fs::path(ckpt) / "iter_0000005" / "metadata.json");
  EXPECT_NE(meta.find("\"consumed_train_samples\": 10"), std::string::npos) << meta;
  auto g = testing::run_cli("generate " + model + "--load " + ckpt +
                            " --prompt '1 2 3' --num-tokens-to-generate 4");
  EXPECT_EQ(g.exit_code, 0) << g.output;
}

}  // namespace
}  // namespace megatron::training
