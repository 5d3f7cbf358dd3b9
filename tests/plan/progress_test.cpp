// Live progress on a terminal (core/progress.h): run under a pseudo-terminal (util-linux's
// `script`), pretrain-gpt draws "iteration I/T | tokens/s | ETA | lm loss" on stderr beside
// Megatron's log lines, which arrive whole; with stdout in a file that file holds Megatron's lines
// only; in a pipe nothing but those lines appears. plan --measure, inspect-data --entropy and
// checkpoint convert draw theirs the same way.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;

const char* kTrain =
    " --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32 "
    "--max-position-embeddings 32"
    " --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 --mock-data --tokenizer-type "
    "NullTokenizer"
    " --vocab-size 4100 --eval-iters 0 --train-iters 6 --log-interval 2";

// `megatron ARGS` on a pseudo-terminal; everything it wrote there.
CommandResult on_terminal(const std::string& args) {
  return run_command("script -qefc '" + cli_path().string() + " " + args + "' /dev/null");
}

TEST(PlanProgress, PretrainShowsALiveLineOnATerminalOnly) {
  TempDir d;
  const fs::path log = d / "train.log";
  CommandResult tty = on_terminal(std::string("pretrain-gpt") + kTrain + " > " + log.string());
  ASSERT_EQ(tty.exit_code, 0) << tty.output;
  EXPECT_NE(tty.output.find("\r\x1b[Kiteration 1/6 | "), std::string::npos) << tty.output;
  EXPECT_NE(tty.output.find(" tokens/s | ETA "), std::string::npos) << tty.output;
  // stdout went to the file: Megatron's lines, nothing of the live line.
  const std::string file = read_file(log);
  EXPECT_NE(file.find("iteration        6/       6 |"), std::string::npos) << file;
  EXPECT_EQ(file.find('\r'), std::string::npos);
  EXPECT_EQ(file.find("\x1b["), std::string::npos);
  EXPECT_EQ(file.find("ETA"), std::string::npos);
  // Both on the terminal: every log line arrives whole, after the live line was erased.
  CommandResult both = on_terminal(std::string("pretrain-gpt") + kTrain);
  ASSERT_EQ(both.exit_code, 0) << both.output;
  EXPECT_NE(both.output.find("\r\x1b[K[20"), std::string::npos) << both.output;  // "[2026-..." line
  // In a pipe: no live line at all.
  CommandResult pipe = run_cli(std::string("pretrain-gpt") + kTrain + " 2>&1 | cat");
  ASSERT_EQ(pipe.exit_code, 0) << pipe.output;
  EXPECT_EQ(pipe.output.find('\r'), std::string::npos);
  EXPECT_EQ(pipe.output.find("ETA"), std::string::npos);
  EXPECT_NE(pipe.output.find("iteration        6/       6 |"), std::string::npos);
}

TEST(PlanProgress, MeasureInspectAndConvertShowProgressOnATerminal) {
  TempDir d;
  CommandResult measure =
      on_terminal(std::string("plan") + kTrain + " --measure --measure-iters 3");
  ASSERT_EQ(measure.exit_code, 0) << measure.output;
  EXPECT_NE(measure.output.find("\r\x1b[Kiteration 1/3 | "), std::string::npos) << measure.output;
  EXPECT_NE(measure.output.find("peak host allocator: measured"), std::string::npos)
      << measure.output;
  // A small dataset and a checkpoint of it.
  write_file(d / "docs.txt", "1 2 3 4 5 6 7 8 9 10 11 12\n13 14 15 16 17 18 19 20\n");
  const std::string prefix = (d / "docs").string();
  ASSERT_EQ(run_cli("preprocess-data --input " + (d / "docs.txt").string() +
                    " --input-format text-lines --workers 1 "
                    "--output-prefix " +
                    prefix +
                    " --tokenizer-type NullTokenizer --vocab-size 4100 "
                    "--append-eod 2>&1")
                .exit_code,
            0);
  CommandResult inspect = on_terminal("inspect-data " + prefix + "_text_document --entropy");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("\r\x1b[K--entropy: 0/"), std::string::npos) << inspect.output;
  ASSERT_EQ(run_cli(std::string("pretrain-gpt") + kTrain + " --save " + (d / "ckpt").string() +
                    " --save-interval 6 2>&1")
                .exit_code,
            0);
  CommandResult convert = on_terminal("checkpoint convert --load " + (d / "ckpt").string() +
                                      " --save " + (d / "tp1").string());
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  EXPECT_NE(convert.output.find("\r\x1b[Kreading 0/1 rank files"), std::string::npos)
      << convert.output;
}

}  // namespace
}  // namespace megatron::testing
