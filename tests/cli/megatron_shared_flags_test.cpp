// Megatron-LM's shared argument parser on every command whose Megatron counterpart parses it
// (pretrain-gpt: pretrain_gpt.py; evaluate: tasks/main.py; generate and serve: the text
// generation tools): every flag of training/megatron_arguments.h is accepted with Megatron's number
// of values; those that cannot matter for the command are named in one warning line; a flag that
// would change the result in a way this build does not implement stops with an error naming it;
// unknown flags stay errors.
#include <gtest/gtest.h>

#include <cctype>
#include <set>

#include "cli/cli_fixture.h"
#include "test_util.h"
#include "training/megatron_arguments.h"

namespace megatron::testing {
namespace {

using training::ArgEffect;
using training::ArgValues;

// The flags `command --help` lists: the command's own (the table's are hidden there).
std::set<std::string> own_flags(const std::string& command) {
  const auto r = run_cli(command + " --help 2>&1");
  std::set<std::string> own;
  for (size_t p = r.output.find("--"); p != std::string::npos; p = r.output.find("--", p + 2)) {
    size_t e = p + 2;
    while (e < r.output.size() && (std::isalnum(static_cast<unsigned char>(r.output[e])) ||
                                   r.output[e] == '-' || r.output[e] == '_'))
      ++e;
    own.insert(r.output.substr(p, e - p));
  }
  return own;
}

// Every flag of the table with `effect` that the command does not define itself, with a value of
// its kind.
std::string every_flag(const std::string& command, const std::set<ArgEffect>& effects) {
  const std::set<std::string> own = own_flags(command);
  std::string line;
  for (const training::MegatronArgument& a : training::megatron_arguments()) {
    if (!effects.count(a.effect)) continue;
    std::string flag = a.flag;
    flag.resize(std::min(flag.find(','), flag.size()));
    if (own.count(flag)) continue;
    line += " " + flag;
    if (a.values == ArgValues::One || a.values == ArgValues::Many) line += " 1";
  }
  return line;
}

std::string fixture_generate() {
  const auto& f = cli_fixture();
  return "generate --load " + f.checkpoint + kFixtureModelFlags + " " + f.tokenizer_flags +
         " --prompt 'The' --num-tokens-to-generate 2 --top_k 1";
}

TEST(MegatronSharedFlags, GenerateAcceptsEveryTrainingAndRuntimeFlagWithOneWarning) {
  const auto r = run_cli(fixture_generate() + every_flag("generate", {ArgEffect::Runtime, ArgEffect::Training}) +
                         " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t w = r.output.find("ignoring Megatron-LM flags that have no effect on generate here: ");
  ASSERT_NE(w, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ignoring Megatron-LM flags", w + 1), std::string::npos) << "one line";
  for (const char* named : {"--use-distributed-optimizer", "--lr", "--wandb-project", "--rampup-batch-size",
                            "--rl-partial-rollouts"})
    EXPECT_NE(r.output.find(named, w), std::string::npos) << named;
}

TEST(MegatronSharedFlags, EvaluateTakesTheTrainingFlagsOfTasksMain) {
  const auto& f = cli_fixture();
  TempDir dir;
  write_file(dir / "lambada.jsonl", "{\"text\": \"the cat sat on the mat\"}\n");
  const auto r = run_cli("evaluate --task LAMBADA --valid-data " + (dir / "lambada.jsonl").string() +
                         " --load " + f.checkpoint + kFixtureModelFlags + " " + f.tokenizer_flags +
                         " --use-distributed-optimizer --lr 1e-4 --weight-decay 0.1 --train-iters 10"
                         " --overlap-grad-reduce --log-params-norm 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t w = r.output.find("ignoring Megatron-LM flags that have no effect on evaluate here: ");
  ASSERT_NE(w, std::string::npos) << r.output;
  const std::string line = r.output.substr(w, r.output.find('\n', w) - w);
  for (const char* named : {"--use-distributed-optimizer", "--lr", "--weight-decay", "--train-iters",
                            "--overlap-grad-reduce", "--log-params-norm"})
    EXPECT_NE(line.find(named), std::string::npos) << named << ": " << line;
}

TEST(MegatronSharedFlags, PretrainAcceptsEveryRuntimeFlag) {
  const auto& f = cli_fixture();
  TempDir dir;
  const std::string base =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
      " --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --train-iters 1"
      " --lr 1e-3 --data-path " + f.data_prefix + " --split 98,2,0 --vocab-file " + f.vocab_file +
      " --merge-file " + f.merge_file + " --eval-iters 0";
  const auto r = run_cli(base + every_flag("pretrain-gpt", {ArgEffect::Runtime}) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ignoring Megatron-LM flags that have no effect on pretrain-gpt here: "),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training finished: 1 iterations"), std::string::npos) << r.output;
}

TEST(MegatronSharedFlags, FlagsThatWouldChangeTheResultAreRefusedByName) {
  const auto& f = cli_fixture();
  const std::string train =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
      " --max-position-embeddings 16 --micro-batch-size 2 --train-iters 1 --lr 1e-3 --data-path " +
      f.data_prefix + " --vocab-file " + f.vocab_file + " --merge-file " + f.merge_file;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {train + " --multi-latent-attention", "--multi-latent-attention (a Megatron-LM flag) changes what the model computes"},
      {train + " --qk-l2-norm", "--qk-l2-norm (a Megatron-LM flag) changes what the model computes"},
      {train + " --decrease-batch-size-if-needed", "--decrease-batch-size-if-needed (a Megatron-LM flag) "
                                                   "changes the training run"},
      {fixture_generate() + " --fp8-format hybrid", "--fp8-format (a Megatron-LM flag) changes what the model"},
      {train + " --lr-decay-stlye cosine", "unknown flag --lr-decay-stlye"},
      {fixture_generate() + " --not-a-megatron-flag", "unknown flag --not-a-megatron-flag"},
  };
  for (const auto& [line, says] : cases) {
    const auto r = run_cli(line + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << line << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << line << "\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron::testing
