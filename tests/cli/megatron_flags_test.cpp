// Megatron-LM's script flags on `pretrain-gpt` and `preprocess-data`: the ones naming what this
// build always does are accepted (and change nothing), backends it cannot use get a one-line
// note, the defaults are pretrain_gpt.py's, and flags given inconsistently are refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A one-layer GPT on the fixture's GPT-2 data; no --tokenizer-type (Megatron's default).
std::string tiny_run(const std::string& save, int iters) {
  const auto& f = cli_fixture();
  return "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
         "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --train-iters " +
         std::to_string(iters) + " --lr 1e-3 --data-path " + f.data_prefix + " --split 98,2,0 "
         "--vocab-file " + f.vocab_file + " --merge-file " + f.merge_file +
         " --eval-iters 0 --log-interval 1 --save " + save + " --save-interval " + std::to_string(iters);
}

json saved_args(const fs::path& save, int iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07d", iteration);
  return json::parse(read_file(save / name / "metadata.json"))["args"];
}

TEST(MegatronFlags, ScriptFlagsForWhatThisBuildAlwaysDoesAreAccepted) {
  TempDir tmp;
  const std::string save = (tmp / "ckpt").string();
  const auto r = run_cli(
      tiny_run(save, 2) +
      " --data-impl mmap --distributed-backend nccl --transformer-impl transformer_engine"
      " --no-masked-softmax-fusion --attention-softmax-in-fp32 --no-gradient-accumulation-fusion"
      " --use-flash-attn --use-cpu-initialization --use-mcore-models --attention-backend flash"
      " --cross-entropy-loss-fusion --cross-entropy-fusion-impl te --no-bias-dropout-fusion"
      " --no-persist-layer-norm --no-async-tensor-model-parallel-allreduce --shape-order BSH"
      " --num-workers 8 --no-create-attention-mask-in-dataloader --no-mmap-bin-files --manual-gc"
      " --manual-gc-interval 10 --no-manual-gc-eval --empty-unused-memory-level 2 --profile"
      " --profile-step-start 1 --profile-step-end 2 --profile-ranks 0 1 --timing-log-level 2"
      " --accumulate-allreduce-grads-in-fp32 --apply-query-key-layer-scaling"
      // Megatron's defaults of the flags the loop does not act on yet, and no-effect cases.
      " --pre-tockens 65536 --next-tockens 0 --grad-reduce-in-bf16"
      " --calculate-per-token-loss"
      " --recompute-granularity full --recompute-method uniform");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("note: --distributed-backend nccl: this build runs its collectives over MPI"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: --transformer-impl transformer_engine"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: --profile"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training finished: 2 iterations"), std::string::npos) << r.output;
  // Defaults as pretrain_gpt.py's: GPT-2 BPE, one layer per recompute chunk, the fused (tanh)
  // bias-GeLU; tokenizer files recorded by absolute path.
  const json args = saved_args(save, 2);
  EXPECT_EQ(args["tokenizer"]["type"], "GPT2BPETokenizer");
  EXPECT_TRUE(fs::path(args["tokenizer"]["vocab_file"].get<std::string>()).is_absolute());
  EXPECT_EQ(args["model"]["recompute_num_layers"], 1);
  EXPECT_EQ(args["model"]["recompute_granularity"], "full");
  EXPECT_EQ(args["model"]["activation"], "gelu_tanh");
}

// The Ascend scripts' sparse attention flags are the sliding window.
TEST(MegatronFlags, PreAndNextTockensAreTheSlidingWindow) {
  TempDir tmp;
  const std::string save = (tmp / "ckpt").string();
  const auto r = run_cli(tiny_run(save, 1) + " --pre-tockens 4 --next-tockens 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json args = saved_args(save, 1);
  EXPECT_EQ(args["model"]["window_left"], 4);
  EXPECT_EQ(args["model"]["window_right"], 0);
}

// --ckpt-format torch writes Megatron-LM's files (tests/training/torch_format_training_test.cpp
// checks them with torch.load and resumes from them); --load reads them back.
TEST(MegatronFlags, CkptFormatTorchWritesMegatronFiles) {
  TempDir tmp;
  const std::string save = (tmp / "ckpt").string();
  const auto r = run_cli(tiny_run(save, 2) + " --exit-interval 1 --ckpt-format torch --transformer-impl local");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(save) / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"));
  EXPECT_FALSE(fs::exists(fs::path(save) / "iter_0000001" / "metadata.json"));
  EXPECT_EQ(read_file(fs::path(save) / "latest_checkpointed_iteration.txt"), "1");
  const auto resumed = run_cli(tiny_run(save, 2) + " --ckpt-format torch --load " + save);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("successfully loaded checkpoint from " + save + " at iteration 1"),
            std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(fs::path(save) / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt"));
}

TEST(MegatronFlags, OldSpellingsKeepTheirMeaning) {
  TempDir tmp;
  const std::string save = (tmp / "ckpt").string();
  const auto r = run_cli(tiny_run(save, 1) + " --checkpoint-activations --no-bias-gelu-fusion");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--checkpoint-activations (removed from Megatron-LM) is taken as"),
            std::string::npos) << r.output;
  const json args = saved_args(save, 1);
  EXPECT_EQ(args["model"]["recompute_granularity"], "full");
  EXPECT_EQ(args["model"]["recompute_method"], "uniform");
  EXPECT_EQ(args["model"]["activation"], "gelu");  // exact GeLU
}

TEST(MegatronFlags, FlagsGivenInconsistentlyAreRefusedByName) {
  struct Case {
    std::string flags, says;
  };
  const std::vector<Case> cases = {
      // Megatron-LM: "expected no batch-size rampup for iteration-based training".
      {"--rampup-batch-size 2 2 100", "--rampup-batch-size needs sample-based training"},
      {"--step-batch-size-schedule '0:2 100:4'",
       "Cannot specify both --step-batch-size-schedule and --global-batch-size"},
      {"--decoupled-min-lr 1e-5", "--decoupled-min-lr needs --decoupled-lr"},
      {"--decoupled-lr 1e-4 --decoupled-min-lr 1e-3", "--decoupled-min-lr (0.001"},
      {"--mock-data", "--mock-data cannot be combined with --data-path"},
      {"--train-epochs 3", "--train-epochs is not a Megatron-LM pretraining flag"},
      {"--skip-train", "--skip-train: nothing to evaluate: --eval-iters is 0"},
      {"--pre-tockens -1", "--pre-tockens and --next-tockens must be >= 0"},
      {"--pre-tockens 4 --window-size 4 0", "--pre-tockens / --next-tockens and --window-size"},
      {"--ckpt-format zarr", "--ckpt-format zarr is not supported"},
      {"--batch-size 8", "use --micro-batch-size"},
      {"--warmup 10", "--lr-warmup-fraction"},
      {"--model-parallel-size 2", "use --tensor-model-parallel-size"},
      {"--data-impl lazy", "--data-impl lazy names Megatron-LM's old non-mmap dataset format"},
      {"--checkpoint-activations --recompute-granularity selective", "cannot be combined"},
      {"--rampup-batch-size 2 2", "--rampup-batch-size"},  // three values
  };
  TempDir tmp;
  for (const auto& c : cases) {
    const auto r = run_cli(tiny_run((tmp / "never").string(), 1) + " " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.flags << "\n" << r.output;
    // No refusal names a flag the user did not give (the window is set through --window-size
    // internally, but the user gave --next-tockens).
    if (c.flags.find("--window-size") == std::string::npos) {
      EXPECT_EQ(r.output.find("--window-size"), std::string::npos) << c.flags << "\n" << r.output;
    }
  }
  EXPECT_FALSE(fs::exists(tmp / "never"));
}

// A Megatron example's training flags on the command line: Megatron's mock data (no --data-path),
// a batch-size ramp-up (2 for 8 samples, then 4: Megatron's 8 iterations for 24 samples), the
// decoupled LR in the log line; then --skip-train on the checkpoint evaluates both splits.
TEST(MegatronFlags, MockDataRampUpDecoupledLrAndSkipTrain) {
  TempDir tmp;
  const auto& f = cli_fixture();
  const std::string save = (tmp / "ckpt").string();
  const std::string common =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
      "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-samples 24 "
      "--rampup-batch-size 2 2 8 --lr 1e-3 --min-lr 1e-4 --decoupled-lr 2e-3 --decoupled-min-lr 2e-4 "
      "--mock-data --vocab-file " + f.vocab_file + " --merge-file " + f.merge_file +
      " --eval-iters 1 --eval-interval 4 --log-interval 1 --save " + save + " --save-interval 100";
  const auto r = run_cli(common);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iteration        8/       8 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| decoupled learning rate: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| global batch size:     2 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| global batch size:     4 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ramping up batch size from 2 to 4 at 8 consumed samples"), std::string::npos)
      << r.output;
  const auto e = run_cli(common + " --load " + save + " --skip-train");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("skipping training (--skip-train is on) ..."), std::string::npos) << e.output;
  EXPECT_NE(e.output.find(" validation loss at iteration 8 on validation set | lm loss value: "),
            std::string::npos) << e.output;
  EXPECT_NE(e.output.find(" validation loss at iteration 8 on test set | lm loss value: "),
            std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("iteration        1/"), std::string::npos) << e.output;
}

TEST(MegatronFlags, PreprocessTakesTheOlderDatasetFlags) {
  TempDir tmp;
  const auto& f = cli_fixture();
  write_file(tmp / "in.jsonl", "{\"text\": \"one two three\"}\n{\"text\": \"four five\"}\n");
  const std::string base = "preprocess-data --input " + (tmp / "in.jsonl").string() +
                           " --tokenizer-type GPT2BPETokenizer --vocab-file " + f.vocab_file +
                           " --merge-file " + f.merge_file + " --append-eod --workers 1";
  auto r = run_cli(base + " --output-prefix " + (tmp / "a").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli(base + " --output-prefix " + (tmp / "b").string() + " --dataset-impl mmap --chunk-size 25");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(read_file(tmp / (std::string("a_text_document") + ext)),
              read_file(tmp / (std::string("b_text_document") + ext)));
  r = run_cli(base + " --output-prefix " + (tmp / "c").string() + " --dataset-impl lazy");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--dataset-impl lazy"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::testing
