// Each command line README's "Coming from Megatron-LM" section quotes, run scaled down (sizes,
// ranks and iterations; paths to the test's files) with its output checked: the launcher and
// single-process training, preprocessing with Megatron's --dataset-impl / --chunk-size, LAMBADA
// evaluation, serving and the client, resharding; and the checkpoint round trip with Megatron-LM:
// resuming a Megatron TP 2 x PP 2 folder, generating from it with --use-checkpoint-args,
// converting it to ours and ours to Megatron's files for another layout. The quoted lines must
// stay in README (the first test), so README and this test change together.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli/cli_fixture.h"
#include "comm/communicator.h"
#include "inference/serve_process.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;

const char* const kQuoted[] = {
    "`megatron launch --nproc_per_node 8 ... pretrain_gpt.py ARGS`",
    "`megatron pretrain-gpt ARGS`",
    "`megatron preprocess-data ARGS` (also `--dataset-impl mmap`, `--chunk-size`)",
    "`megatron evaluate --task LAMBADA ARGS`",
    "`megatron serve ARGS`",
    "`megatron client HOST:PORT`",
    "`megatron checkpoint convert --target-tensor-parallel-size T ...`",
    "megatron pretrain-gpt --load /ckpt/gpt345m_tp2pp2 --tensor-model-parallel-size 2 \\\n"
    "    --pipeline-model-parallel-size 2 ...",
    "megatron generate --load /ckpt/gpt345m_tp2pp2 --use-checkpoint-args ...",
    "megatron checkpoint convert --load /ckpt/gpt345m_tp2pp2 --save /ckpt/gpt345m",
    "megatron checkpoint convert --load ckpt --save /ckpt/for_mlm --save-format torch \\\n"
    "    --target-tensor-parallel-size 8 --target-pipeline-parallel-size 2 [--transformer-impl local]",
};

TEST(ComingFromMegatron, ReadmeQuotesTheseLines) {
  const std::string readme = read_file(source_dir() / "README.md");
  const size_t begin = readme.find("## Coming from Megatron-LM");
  ASSERT_NE(begin, std::string::npos);
  const std::string section = readme.substr(begin, readme.find("\n## ", begin + 1) - begin);
  for (const char* q : kQuoted) EXPECT_NE(section.find(q), std::string::npos) << q;
}

std::string small_gpt(const std::string& data) {
  const auto& f = cli_fixture();
  return " --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
         " --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 2"
         " --lr 1e-3 --data-path " + data + " --split 98,2,0 --vocab-file " + f.vocab_file +
         " --merge-file " + f.merge_file + " --eval-iters 0 --log-interval 1";
}

TEST(ComingFromMegatron, TrainingPreprocessingEvaluationServingAndResharding) {
  const auto& f = cli_fixture();
  TempDir dir;
  // megatron pretrain-gpt ARGS
  const auto one = run_cli("pretrain-gpt" + small_gpt(f.data_prefix) + " 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("training finished: 2 iterations"), std::string::npos) << one.output;
  // megatron launch --nproc_per_node N ... pretrain_gpt.py ARGS
  if (!launched_under_mpi()) {
    const auto two = run_cli("launch --nproc_per_node 2 --nnodes 1 --master_addr localhost"
                             " --master_port 6000 pretrain_gpt.py" + small_gpt(f.data_prefix) +
                             " --tensor-model-parallel-size 2 2>&1");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_NE(two.output.find("training finished: 2 iterations"), std::string::npos) << two.output;
  }
  // megatron preprocess-data ARGS (--dataset-impl mmap, --chunk-size)
  write_file(dir / "corpus.jsonl", "{\"text\": \"Coming from Megatron-LM, nothing changes.\"}\n"
                                   "{\"text\": \"The launcher line is the only difference.\"}\n");
  const auto pre = run_cli("preprocess-data --input " + (dir / "corpus.jsonl").string() +
                           " --output-prefix " + (dir / "corpus").string() + " " + f.tokenizer_flags +
                           " --append-eod --workers 1 --dataset-impl mmap --chunk-size 25 2>&1");
  ASSERT_EQ(pre.exit_code, 0) << pre.output;
  EXPECT_TRUE(fs::exists(dir / "corpus_text_document.bin")) << pre.output;
  EXPECT_TRUE(fs::exists(dir / "corpus_text_document.idx")) << pre.output;
  // megatron evaluate --task LAMBADA ARGS
  write_file(dir / "lambada.jsonl", "{\"text\": \"the cat sat on the mat\"}\n");
  const auto eval = run_cli("evaluate --task LAMBADA --valid-data " + (dir / "lambada.jsonl").string() +
                            " --load " + f.checkpoint + kFixtureModelFlags + " " + f.tokenizer_flags + " 2>&1");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("number correct: "), std::string::npos) << eval.output;
  // megatron serve ARGS, then megatron client HOST:PORT
  inference::testing::ServeProcess server("--load " + f.checkpoint + kFixtureModelFlags + " " +
                                          f.tokenizer_flags, dir / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  const auto client = run_command("printf 'The cat\\n4\\n' | " + cli_path().string() + " client localhost:" +
                                  std::to_string(server.port()) + " 2>&1");
  EXPECT_EQ(client.exit_code, 0) << client.output;
  EXPECT_NE(client.output.find("Megatron Response:"), std::string::npos) << client.output;
  EXPECT_TRUE(server.stop()) << server.log();
  // megatron checkpoint convert --target-tensor-parallel-size T ...
  const auto convert = run_cli("checkpoint convert --load " + f.checkpoint + " --save " +
                               (dir / "tp2").string() + " --target-tensor-parallel-size 2 2>&1");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  EXPECT_NE(convert.output.find("to TP=2 x PP=1"), std::string::npos) << convert.output;
}

TEST(ComingFromMegatron, CheckpointsToMegatronAndBack) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  TempDir dir;
  // A Megatron-LM TP 2 x PP 2 folder (Debian's torch, Megatron's structure) and a corpus its
  // NullTokenizer vocabulary covers.
  const auto made = run_command("/usr/bin/python3 " + (source_dir() / "tests/reference/megatron_checkpoint.py").string() +
                                " make " + dir.path().string() + " core_tp2pp2_bf16 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string mlm = (dir / "core_tp2pp2_bf16" / "megatron").string();
  std::string docs;
  for (int d = 0; d < 40; ++d) {
    docs += "{\"text\": \"";
    for (int t = 0; t < 40; ++t) docs += std::to_string((d * 7 + t * 3) % 58 + 1) + " ";
    docs += "\"}\n";
  }
  write_file(dir / "numbers.jsonl", docs);
  const std::string tok = " --tokenizer-type NullTokenizer --vocab-size 60";
  const auto pre = run_cli("preprocess-data --input " + (dir / "numbers.jsonl").string() + " --output-prefix " +
                           (dir / "numbers").string() + tok + " --append-eod --workers 1 2>&1");
  ASSERT_EQ(pre.exit_code, 0) << pre.output;
  // megatron pretrain-gpt --load /ckpt/gpt345m_tp2pp2 --tensor-model-parallel-size 2
  //     --pipeline-model-parallel-size 2 ...
  const auto resumed = run_cli(
      "launch --nproc_per_node 4 --nnodes 1 --master_addr localhost --master_port 6000"
      " pretrain_gpt.py --load " + mlm + " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
      " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32"
      " --max-position-embeddings 32 --make-vocab-size-divisible-by 16" + tok +
      " --micro-batch-size 2 --global-batch-size 8 --train-iters 8 --lr 3e-3 --min-lr 3e-4"
      " --lr-decay-style cosine --lr-warmup-iters 2 --lr-decay-iters 20 --weight-decay 0.1"
      " --adam-beta2 0.95 --bf16 --hidden-dropout 0"
      " --attention-dropout 0 --data-path " + (dir / "numbers_text_document").string() +
      " --split 100,0,0 --eval-iters 0 --log-interval 1 2>&1");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("successfully loaded checkpoint from " + mlm + " at iteration 7"),
            std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("training finished: 8 iterations"), std::string::npos) << resumed.output;
  // megatron generate --load /ckpt/gpt345m_tp2pp2 --use-checkpoint-args ...
  const auto gen = run_cli("generate --load " + mlm + " --use-checkpoint-args" + tok +
                           " --prompt '1 2 3' --num-tokens-to-generate 3 --top_k 1 2>&1");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  // megatron checkpoint convert --load /ckpt/gpt345m_tp2pp2 --save /ckpt/gpt345m
  const auto ours = run_cli("checkpoint convert --load " + mlm + " --save " + (dir / "ours").string() + " 2>&1");
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  EXPECT_NE(ours.output.find("to TP=1 x PP=1"), std::string::npos) << ours.output;
  // megatron checkpoint convert --load ckpt --save /ckpt/for_mlm --save-format torch
  //     --target-tensor-parallel-size 8 --target-pipeline-parallel-size 2 [--transformer-impl local]
  const auto back = run_cli("checkpoint convert --load " + (dir / "ours").string() + " --save " +
                            (dir / "for_mlm").string() + " --save-format torch"
                            " --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2"
                            " --transformer-impl local 2>&1");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_NE(back.output.find("format: Megatron-LM torch checkpoint"), std::string::npos) << back.output;
  EXPECT_TRUE(fs::exists(dir / "for_mlm" / "iter_0000007" / "mp_rank_01_001" / "model_optim_rng.pt"));
}

}  // namespace
}  // namespace megatron::testing
