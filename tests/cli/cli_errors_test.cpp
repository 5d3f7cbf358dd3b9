// Command-line mistakes: an unknown command or flag is named with the closest valid name, after
// "error: ", with exit status 1 (README); no message mentions a flag the user never gave.
#include <gtest/gtest.h>

#include "test_util.h"

namespace megatron::cli {
namespace {

namespace mt = megatron::testing;

void expect_error(const std::string& args, const std::vector<std::string>& says) {
  const auto r = mt::run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << args << "\n" << r.output;
  for (const auto& s : says) EXPECT_NE(r.output.find(s), std::string::npos) << args << "\n" << r.output;
}

TEST(CliErrors, UnknownCommandsAndFlagsAreNamedWithTheClosestName) {
  expect_error("pretrian-gpt --num-layers 2", {"unknown command 'pretrian-gpt'", "did you mean pretrain-gpt?"});
  expect_error("frobnicate", {"unknown command 'frobnicate'", "megatron --help"});
  expect_error("", {"no command given"});
  expect_error("pretrain-gpt --num-layers 2 --lr-decay-stlye cosine",
               {"unknown flag --lr-decay-stlye for pretrain-gpt", "did you mean --lr-decay-style?",
                "megatron pretrain-gpt --help"});
  expect_error("pretrain-gpt --lr-decay-stlye=cosine", {"unknown flag --lr-decay-stlye for"});
  expect_error("pretrain-gpt --micro_batch_size 2", {"did you mean --micro-batch-size?"});
  expect_error("pretrain-gpt --completely-unrelated-flag 2", {"unknown flag --completely-unrelated-flag"});
  expect_error("generate --load x --top-kk 3", {"unknown flag --top-kk for generate", "did you mean --top"});
  expect_error("checkpoint convrt --load a --save b", {"unknown command 'checkpoint convrt'", "convert"});
  expect_error("checkpoint convert --load a --save b --target-tensor-parallel 2",
               {"unknown flag --target-tensor-parallel for checkpoint convert",
                "--target-tensor-parallel-size"});
  expect_error("--log-levle warn version", {"unknown flag --log-levle", "--log-level"});
  expect_error("launch --nproc_per_nod 2 -- version", {"unknown flag --nproc_per_nod for launch",
                                                        "--nproc-per-node"});
  // Values that are not flags are not mistaken for flags.
  expect_error("pretrain-gpt --lr-warmup-init -1 --bogus", {"unknown flag --bogus"});
  // Errors CLI11 finds itself keep its text, prefixed and with status 1.
  expect_error("pretrain-gpt --lr abc", {"pretrain-gpt: ", "--lr"});
  expect_error("pretrain-gpt --attention-backend fastest", {"--attention-backend", "fastest"});
}

TEST(CliErrors, HelpAndVersionStillExitZero) {
  auto r = mt::run_cli("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = mt::run_cli("pretrain-gpt --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--attention-backend"), std::string::npos);
  r = mt::run_cli("evaluate --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--strict-lambada"), std::string::npos);
}

// Messages name only flags that were given (or say what to add): the defaults Megatron has
// (--recompute-num-layers 1, --tokenizer-type GPT2BPETokenizer) no longer produce errors about
// flags a script never passes.
TEST(CliErrors, NoMessageMentionsAFlagThatWasNotGiven) {
  mt::TempDir tmp;
  // Recompute with Megatron's default chunk of one layer: the run gets as far as the data.
  auto r = mt::run_cli("pretrain-gpt --num-layers 2 --hidden-size 16 --num-attention-heads 2 "
                       "--seq-length 16 --micro-batch-size 1 --train-iters 1 --lr 1e-3 "
                       "--recompute-granularity full --recompute-method uniform --data-path " +
                       (tmp / "missing").string() + " --vocab-file " + (tmp / "v.json").string() +
                       " --merge-file " + (tmp / "m.txt").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.find("--recompute-num-layers"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--tokenizer-type"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::cli
