// `megatron evaluate` (Megatron's tasks/main.py --task LAMBADA | WIKITEXT103): the detokenizers
// and Python string rules against Python itself, the WikiText windows against Megatron's
// _LMDataset worked by hand, and on a GPT trained by `megatron pretrain-gpt` (the fixture), the
// accuracy and perplexity against an independent PyTorch computation over the same files and
// checkpoint (tests/reference/zeroshot_reference.py), for the checkpoint as saved and resharded
// to TP2; Megatron's output lines; mistakes as clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/cli_fixture.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "inference/evaluate.h"
#include "test_util.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

json python_json(const std::string& command) {
  const auto r = mt::run_command(command + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return json::parse(r.output);
}

std::string reference_script() {
  return "/usr/bin/python3 '" + (mt::source_dir() / "tests" / "reference" / "zeroshot_reference.py").string() + "'";
}

TEST(ZeroShot, DetokenizersAndStringRulesMatchPython) {
  mt::TempDir tmp;
  const std::string text =
      " = = = Early life = = = \n The band 's first single , \" Love @-@ Song \" ( released in 1 @,@ 000 "
      "copies ) sold 2 @.@ 5 million ; it was [ reissued ] and { later } covered . \n Fans ' "
      "choice : the ' best ' song ! Why ? 20 \u00b0 C , N people , /' 3/ and ( nested ( inner ) "
      "text ) , unmatched ( here and \" there \n He did n't pay $ 1 or # 1 . ( \u00a0 nbsp \u00a0 ) "
      "'s end \u3000";
  mt::write_file(tmp / "text.txt", text);
  const json want = python_json(reference_script() + " --detokenize '" + (tmp / "text.txt").string() + "'");
  EXPECT_EQ(wikitext_detokenize(text), want["wiki"].get<std::string>());
  EXPECT_EQ(ptb_detokenize(text), want["ptb"].get<std::string>());
  EXPECT_EQ(python_strip(text), want["strip"].get<std::string>());
  EXPECT_EQ(python_split(text), want["split"].get<std::vector<std::string>>());
  EXPECT_EQ(detokenizer_for_path("data/wikitext-103/wiki.test.tokens"), Detokenizer::Wiki);
  EXPECT_EQ(detokenizer_for_path("ptb/wiki.txt"), Detokenizer::Ptb);  // "ptb" is tried first
  EXPECT_EQ(detokenizer_for_path("lambada_test.jsonl"), Detokenizer::Lambada);
  EXPECT_EQ(detokenizer_for_path("test.txt"), std::nullopt);
}

// Megatron's _LMDataset for 10 tokens, seq-length 4, overlapping-eval 3: targets 9, windows
// ceil((9 - 3) / 3) + 1 = 3 starting at 0, 3, 6; after the first only the last 3 targets count.
TEST(ZeroShot, WikitextWindowsAreMegatronsLMDataset) {
  const LMWindows w({10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 4, 99, 3, 7);
  ASSERT_EQ(w.size(), 3);
  EXPECT_EQ(w.get(0).tokens, (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(w.get(0).loss_mask, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(w.get(1).tokens, (std::vector<int32_t>{13, 14, 15, 16, 17}));
  EXPECT_EQ(w.get(1).loss_mask, (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(w.get(2).tokens, (std::vector<int32_t>{16, 17, 18, 19, 99}));  // padded with EOD
  EXPECT_EQ(w.get(2).loss_mask, (std::vector<uint8_t>{0, 1, 1, 0}));
  // Every target counted once: 4 + 3 + 2 = 9.
  // overlapping-eval = seq-length: disjoint windows, no masking after the first.
  const LMWindows d({10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 4, 99, 4, 7);
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.get(1).loss_mask, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(d.get(2).loss_mask, (std::vector<uint8_t>{1, 0, 0, 0}));
}

TEST(ZeroShot, ResultLinesAreMegatrons) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1.095808383233533), "1.095808383233533");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(lambada_result_line("LAMBADA", 3, 8),
            " validation results on LAMBADA | number correct: 3.0000E+00 | total examples: "
            "8.0000E+00 | avg accuracy: 3.7500E-01");
  // avg loss 2 over 11 tokens, ratio 10 / 5 = 2.0.
  EXPECT_EQ(wikitext_result_line("WIKITEXT103", 20.0, 11, 6),
            " validation results on WIKITEXT103 | avg loss: 2.0000E+00 | ppl: 7.3891E+00 | "
            "adjusted ppl: 5.4598E+01 | token ratio: 2.0 |");
}

// The evaluation files: LAMBADA lines ending in words the small model does and does not predict
// (it has learnt that a comma is the likeliest next token), and WikiText-style text with its
// markup.
struct EvalFiles {
  EvalFiles() {
    const std::vector<std::string> texts = {
        "The jury said it did find that many of the",
        "It was one of the best things that ever happened to him and one of the",
        "She opened the door and saw that the room was empty except for a small wooden chair",
        "He could not remember where he had left his keys, so he searched the whole house.",
        "\u201cWe will meet again tomorrow,\u201d she said, and closed the book with a sigh",
        "After the storm passed, the children ran outside to play in the",
        "When the day was over and the work was done,",
        "They went to the market and bought apples,",
        "I think, and I have always thought,",
    };
    std::string lines;
    for (const auto& t : texts) lines += json({{"text", t}}).dump() + "\n";
    mt::write_file(dir / "lambada_test.jsonl", lines);
    std::string wiki =
        " \n = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre "
        "actor . He had a guest @-@ starring role on the television series The Bill in 2000 . "
        "This was followed by a starring role in the play Herons written by Simon Stephens , "
        "which was performed in 2001 at the Royal Court Theatre . \n \n = = Career = = \n \n In "
        "2006 , Boulter starred alongside Whishaw in the play Citizenship written by Mark "
        "Ravenhill . He appeared on a 2006 episode of the television series , Doctors , followed "
        "by a role in the 2007 theatre production of How to Curse directed by Josie Rourke . In "
        "2008 , he played a role in ( the 1 @,@ 000 @.@ 5 km ) film \" Donkey Punch \" and the "
        "weather was 20 \u00b0 C , N people came . \n";
    mt::write_file(dir / "wiki.test.tokens", wiki);
  }
  mt::TempDir dir;
};

struct Result {
  std::string line;        // Megatron's result line
  int64_t correct = -1, samples = -1;
  double loss_sum = NAN;
  std::string output;
};

Result evaluate(const std::string& load, const std::string& flags) {
  const auto& f = mt::cli_fixture();
  const auto r = mt::run_cli("evaluate --load " + load + " --use-checkpoint-args" + f.tokenizer_flags +
                             " " + flags + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
  Result out;
  out.output = r.output;
  std::smatch m;
  if (std::regex_search(r.output, m, std::regex("\n( validation results on [^\n]*)\n")))
    out.line = m[1].str();
  if (std::regex_search(r.output, m,
                        std::regex(R"(evaluate: (\d+) samples, (\d+) correct, \d+ scored tokens, loss sum (\S+) nats)"))) {
    out.samples = std::stoll(m[1].str());
    out.correct = std::stoll(m[2].str());
    out.loss_sum = std::stod(m[3].str());
  }
  return out;
}

json reference(const std::string& flags) {
  return python_json(reference_script() + " '" + mt::cli_fixture().checkpoint + "' " + flags);
}

TEST(ZeroShot, LambadaAccuracyEqualsPyTorch) {
  EvalFiles files;
  const std::string data = (files.dir / "lambada_test.jsonl").string();
  const auto& f = mt::cli_fixture();
  for (const bool strict : {false, true}) {
    const std::string s = strict ? " --strict-lambada" : "";
    const Result got = evaluate(f.checkpoint, "--task LAMBADA --valid-data " + data + s +
                                                  " --micro-batch-size 4 --log-interval 1");
    const json want = reference("--task LAMBADA --file " + data + " --seq-length 32" + s);
    EXPECT_EQ(got.samples, want["total"].get<int64_t>()) << got.output;
    EXPECT_EQ(got.correct, want["correct"].get<int64_t>()) << got.output;
    EXPECT_NEAR(got.loss_sum, want["loss_sum"].get<double>(), 1e-5 * want["loss_sum"].get<double>());
    EXPECT_NE(got.output.find("> building lambada dataset from " + data + " ..."), std::string::npos);
    EXPECT_NE(got.output.find(" > found 9 samples."), std::string::npos) << got.output;
    EXPECT_NE(got.output.find("> working on iteration: 2"), std::string::npos) << got.output;
    EXPECT_EQ(got.line, lambada_result_line("LAMBADA", got.correct, got.samples));
    const std::string dashes(got.line.size() + 1, '-');
    EXPECT_NE(got.output.find(dashes + "\n" + got.line + "\n" + dashes + "\ndone :-)"),
              std::string::npos) << got.output;
    if (!strict) {  // the file mixes predicted and missed words, so the count means something
      EXPECT_GT(got.correct, 0) << got.output;
      EXPECT_LT(got.correct, got.samples) << got.output;
    }
  }
}

TEST(ZeroShot, WikitextPerplexityEqualsPyTorch) {
  EvalFiles files;
  const std::string data = (files.dir / "wiki.test.tokens").string();
  for (const int overlap : {32, 8}) {
    const std::string o = " --overlapping-eval " + std::to_string(overlap);
    const Result got = evaluate(mt::cli_fixture().checkpoint, "--task WIKITEXT103 --valid-data " + data +
                                                                  o + " --micro-batch-size 3");
    const json want = reference("--task WIKITEXT103 --file " + data + " --seq-length 32" + o);
    EXPECT_EQ(got.samples, want["total"].get<int64_t>()) << got.output;
    EXPECT_NEAR(got.loss_sum, want["loss_sum"].get<double>(), 1e-5 * want["loss_sum"].get<double>());
    const int64_t tokens = want["num_tokenized_tokens"], words = want["num_original_tokens"];
    EXPECT_NE(got.output.find(str(" > number of original tokens: ", words,
                                  ", number of detokenized tokens: ", tokens)),
              std::string::npos) << got.output;
    EXPECT_EQ(got.line, wikitext_result_line("WIKITEXT103", want["loss_sum"].get<double>(), tokens, words))
        << got.output;
  }
}

// The fixture's checkpoint resharded to TP2 in the test's folder ("" when the conversion fails).
std::string tp2_checkpoint(const EvalFiles& files) {
  const std::string tp2 = (files.dir / "tp2").string();
  const auto c = mt::run_cli("checkpoint convert --load " + mt::cli_fixture().checkpoint +
                             " --save " + tp2 + " --target-tensor-parallel-size 2");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  return c.exit_code == 0 ? tp2 : "";
}

// A tensor-parallel checkpoint evaluates the same (its shards merged in memory), with
// --tensor-model-parallel-size 1 or its own size; another size is refused.
TEST(ZeroShot, ShardedCheckpointsGiveTheSameResult) {
  EvalFiles files;
  const auto& f = mt::cli_fixture();
  const std::string tp2 = tp2_checkpoint(files);
  ASSERT_FALSE(tp2.empty());
  const std::string task = "--task WIKITEXT103 --valid-data " + (files.dir / "wiki.test.tokens").string();
  const Result one = evaluate(f.checkpoint, task);
  const Result two = evaluate(tp2, task + " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1");
  EXPECT_FALSE(one.line.empty()) << one.output;
  EXPECT_EQ(one.line, two.line) << two.output;
  EXPECT_NEAR(one.loss_sum, two.loss_sum, 1e-6 * one.loss_sum);
  const auto bad = mt::run_cli("evaluate --load " + tp2 + " --use-checkpoint-args" + f.tokenizer_flags +
                               " " + task + " --tensor-model-parallel-size 4");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--tensor-model-parallel-size 4 differs from the checkpoint's (2"),
            std::string::npos) << bad.output;
}

// Across ranks (Megatron's tasks/main.py under torchrun): every rank loads its TP2 shard, and with
// four ranks two data-parallel replicas split the samples; the result line and the loss equal the
// single-process run's, and rank 0 alone prints them.
TEST(ZeroShot, ModelParallelRanksGiveTheSameResult) {
  EvalFiles files;
  const auto& f = mt::cli_fixture();
  const std::string tp2 = tp2_checkpoint(files);
  ASSERT_FALSE(tp2.empty());
  const std::string task = "--task LAMBADA --valid-data " +
                           (files.dir / "lambada_test.jsonl").string() + " --micro-batch-size 2";
  const Result one = evaluate(f.checkpoint, task);
  ASSERT_FALSE(one.line.empty()) << one.output;
  for (const int ranks : {2, 4}) {
    const auto r = mt::run_command("OMP_NUM_THREADS=1 '" + mt::cli_path().string() +
                                   "' launch --nproc-per-node " + std::to_string(ranks) +
                                   " -- evaluate --load " + tp2 + " --use-checkpoint-args" +
                                   f.tokenizer_flags + " " + task +
                                   " --tensor-model-parallel-size 2 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(loss sum (\S+) nats)"))) << r.output;
    EXPECT_NEAR(std::stod(m[1].str()), one.loss_sum, 1e-5 * one.loss_sum) << r.output;
    EXPECT_NE(r.output.find("\n" + one.line + "\n"), std::string::npos) << r.output;
    size_t lines = 0;
    for (size_t at = r.output.find(one.line); at != std::string::npos;
         at = r.output.find(one.line, at + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << r.output;  // rank 0 alone prints
  }
}

// examples/evaluate_zeroshot_gpt.sh (its removed --batch-size spelled --micro-batch-size), with
// torch.distributed.launch replaced: two data-parallel ranks give the single process's result.
TEST(ZeroShot, MegatronsEvaluationScriptRunsDataParallel) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  EvalFiles files;
  const auto& f = mt::cli_fixture();
  const std::string data = (files.dir / "lambada_test.jsonl").string();
  const std::string model =
      " --task LAMBADA --valid-data " + data + " --tokenizer-type GPT2BPETokenizer --strict-lambada"
      " --vocab-file " + f.vocab_file + " --merge-file " + f.merge_file + " --load " + f.checkpoint +
      " --tensor-model-parallel-size 1 --num-layers 1 --hidden-size 32 --num-attention-heads 4"
      " --micro-batch-size 8 --seq-length 32 --max-position-embeddings 32 --log-interval 10 --fp16"
      " --no-load-optim --no-load-rng";
  const auto one = mt::run_cli("evaluate" + model + " 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto two = mt::run_cli("launch --nproc_per_node 2 --nnodes 1 --node_rank 0 --master_addr "
                               "localhost --master_port 6000 ./tasks/main.py" + model + " 2>&1");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  std::smatch m1, m2;
  const std::regex result("\n( validation results on [^\n]*)\n");
  ASSERT_TRUE(std::regex_search(one.output, m1, result)) << one.output;
  ASSERT_TRUE(std::regex_search(two.output, m2, result)) << two.output;
  EXPECT_EQ(m1[1].str(), m2[1].str());
  size_t lines = 0;  // printed once, by rank 0
  for (size_t p = two.output.find("validation results on"); p != std::string::npos;
       p = two.output.find("validation results on", p + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << two.output;
}

TEST(ZeroShot, MistakesAreClearErrors) {
  EvalFiles files;
  const auto& f = mt::cli_fixture();
  mt::write_file(files.dir / "bad.jsonl", "{\"text\": \"fine line\"}\nnot json\n");
  mt::write_file(files.dir / "notext.jsonl", "{\"txt\": \"x\"}\n");
  const std::string base = "evaluate --load " + f.checkpoint + " --use-checkpoint-args" + f.tokenizer_flags;
  struct Case {
    std::string flags, says;
  };
  const std::vector<Case> cases = {
      {" --task RACE --valid-data x", "--task RACE is not implemented"},
      {" --task LAMBADA --valid-data " + (files.dir / "bad.jsonl").string(), "bad.jsonl:2: not a JSON object"},
      {" --task LAMBADA --valid-data " + (files.dir / "notext.jsonl").string(), "notext.jsonl:1: no \"text\""},
      {" --task LAMBADA --valid-data " + (files.dir / "none.jsonl").string(), "cannot read --valid-data"},
      {" --task LAMBADA --valid-data a b", "--valid-data takes exactly one file"},
      {" --task LAMBADA --valid-data x --batch-size 8", "use --micro-batch-size"},
  };
  for (const auto& c : cases) {
    const auto r = mt::run_cli(base + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron::inference
