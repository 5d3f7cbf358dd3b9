// `generate` and `serve` across tensor- and pipeline-parallel ranks (`megatron launch
// --nproc-per-node N -- generate ...`): a tiny model's random weights saved as a single-rank
// checkpoint and resharded to TP2, PP2 and TP2 x PP2; every rank loads only its shard, and the
// tokens and log-probs must equal the single-process run of the single-rank checkpoint, greedy
// and sampled with a seed. The server on four ranks answers concurrent clients, refuses a
// malformed request mid-stream with 400 and answers the next ones right, and stops on SIGTERM
// with every rank finishing; `evaluate` on TP2 x PP2 and PP2 x DP2 ranks scores as one process.
#include <gtest/gtest.h>

#include <future>
#include <regex>
#include <thread>
#include <tuple>

#include "cli_test_util.h"
#include "serve_process.h"
#include "sharded_checkpoint_util.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using testing::json_lines;

const std::string kTokenizer = " --tokenizer-type NullTokenizer --vocab-size 64"
                               " --make-vocab-size-divisible-by 16 --use-checkpoint-args";

// A single-rank checkpoint of `c`'s random weights and its TP x PP reshardings.
struct Checkpoints {
  explicit Checkpoints(const testing::Config& c) {
    save_training_checkpoint(dir.path() / "tp1", testing::random_weights(c), c, 64, 16);
    for (const auto& [tp, pp] : {std::pair{2, 1}, {1, 2}, {2, 2}})
      convert(dir.path() / "tp1", path(tp, pp), tp, pp);
  }
  fs::path path(int tp, int pp) const {
    return dir.path() / (tp * pp == 1 ? std::string("tp1") : str("tp", tp, "pp", pp));
  }
  mt::TempDir dir;
};

const std::string kPrompts = " --prompt '1 2 3 4' --prompt '9 8' --prompt '5 17 33 2 40'";

std::string generate_cmd(const Checkpoints& ck, int tp, int pp, const std::string& flags,
                         const fs::path& load = {}) {
  const std::string launch = tp * pp == 1 ? "" : str("launch --nproc-per-node ", tp * pp, " -- ");
  return str("OMP_NUM_THREADS=1 '", mt::cli_path().string(), "' ", launch, "generate --load ",
             (load.empty() ? ck.path(tp, pp) : load).string(), kTokenizer, " --tensor-model-parallel-size ", tp,
             " --pipeline-model-parallel-size ", pp, " --output-format jsonl", kPrompts, " ", flags);
}

void expect_same_generations(const std::string& single, const std::string& multi,
                             const std::string& what) {
  const auto a = json_lines(single), b = json_lines(multi);
  ASSERT_EQ(a.size(), 3u) << single;
  ASSERT_EQ(b.size(), a.size()) << what << "\n" << multi;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["tokens"], a[i]["tokens"]) << what << " prompt " << i;
    ASSERT_EQ(b[i]["logprobs"].size(), a[i]["logprobs"].size()) << what;
    for (size_t j = 0; j < a[i]["logprobs"].size(); ++j)
      EXPECT_NEAR(b[i]["logprobs"][j].get<double>(), a[i]["logprobs"][j].get<double>(), 1e-4)
          << what << " prompt " << i << " position " << j;
  }
}

TEST(ModelParallelGenerate, EveryLayoutGeneratesWhatOneProcessGenerates) {
  for (const bool llama : {false, true}) {
    const Checkpoints ck(llama ? testing::llama_config() : testing::gpt2_config());
    const std::string greedy = "--num-tokens-to-generate 8 --return-log-probs";
    const std::string sampled = greedy + " --top_k 0 --top_p 0.9 --temperature 1.5 --random-seed 5";
    for (const std::string& flags : {greedy, sampled}) {
      const auto one = mt::run_command(generate_cmd(ck, 1, 1, flags));
      ASSERT_EQ(one.exit_code, 0) << one.output;
      // GPT-2-style: TP2 and PP2; Llama-style (GQA, rotary, untied): TP2 x PP2, 4 ranks.
      const auto layouts = llama ? std::vector<std::pair<int, int>>{{2, 2}}
                                 : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}};
      for (const auto& [tp, pp] : layouts) {
        const auto many = mt::run_command(generate_cmd(ck, tp, pp, flags));
        ASSERT_EQ(many.exit_code, 0) << many.output;
        expect_same_generations(one.output, many.output,
                                str(llama ? "llama" : "gpt2", " TP", tp, " PP", pp, " ", flags));
        // Rank 0 alone prints: three results, not one set per rank.
        EXPECT_EQ(json_lines(many.output).size(), 3u) << many.output;
      }
    }
  }
}

TEST(ModelParallelGenerate, BeamSearchAndMistakesAcrossRanks) {
  const Checkpoints ck(testing::gpt2_config());
  const std::string beams = "--num-tokens-to-generate 5 --beam-width 3 --stop-token 63";
  const auto one = mt::run_command(generate_cmd(ck, 1, 1, beams));
  const auto many = mt::run_command(generate_cmd(ck, 2, 2, beams));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(many.exit_code, 0) << many.output;
  const auto a = json_lines(one.output), b = json_lines(many.output);
  ASSERT_EQ(a.size(), 9u) << one.output;
  ASSERT_EQ(b.size(), a.size()) << many.output;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["tokens"], a[i]["tokens"]) << i;
    EXPECT_NEAR(b[i]["score"].get<double>(), a[i]["score"].get<double>(), 1e-4) << i;
  }
  // A layout other than the checkpoint's is an error naming both (no merging across ranks).
  const auto wrong = mt::run_command(generate_cmd(ck, 2, 2, "", ck.path(2, 1)));
  EXPECT_NE(wrong.exit_code, 0) << wrong.output;
  EXPECT_NE(wrong.output.find("--pipeline-model-parallel-size 2 differs from the checkpoint's (1"),
            std::string::npos) << wrong.output;
  // A prompt beyond the model's length fails on rank 0 and ends every rank (no hang).
  const auto too_long = mt::run_command(
      generate_cmd(ck, 2, 1, "--num-tokens-to-generate 31 --prompt '1 2 3'"));
  EXPECT_NE(too_long.exit_code, 0) << too_long.output;
  EXPECT_NE(too_long.output.find("exceeds the model's maximum sequence length"), std::string::npos)
      << too_long.output;
}

// What the single-process `generate` gives greedily for each prompt (the server's reference).
std::vector<std::vector<int32_t>> reference_tokens(const Checkpoints& ck,
                                                   const std::vector<std::string>& prompts, int n) {
  std::string flags = str("--num-tokens-to-generate ", n);
  for (const auto& p : prompts) flags += " --prompt '" + p + "'";
  const auto r = mt::run_command(str("'", mt::cli_path().string(), "' generate --load ",
                                     ck.path(1, 1).string(), kTokenizer,
                                     " --output-format jsonl ", flags));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::vector<int32_t>> out;
  for (const auto& j : json_lines(r.output)) out.push_back(j["tokens"].get<std::vector<int32_t>>());
  return out;
}

TEST(ModelParallelServe, ConcurrentClientsAndABadRequestOnFourRanks) {
  const Checkpoints ck(testing::gpt2_config());
  testing::ServeProcess server(
      str("--load ", ck.path(2, 2).string(), kTokenizer,
          " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"),
      ck.dir.path() / "serve.log", "launch --nproc-per-node 4 --");
  ASSERT_GT(server.port(), 0) << server.log();
  const std::vector<std::string> prompts = {"1 2 3", "9 8", "5 17 33 2", "7"};
  const auto want = reference_tokens(ck, prompts, 6);
  ASSERT_EQ(want.size(), prompts.size());
  auto ask = [&](size_t i) {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(120, 0);
    const auto r = c.Put("/api", str(R"({"prompts": [")", prompts[i],
                                      R"("], "tokens_to_generate": 6, "top_k": 1})"),
                         "application/json");
    if (!r || r->status != 200) return std::vector<int32_t>{-1};
    return nlohmann::json::parse(r->body)["tokens"][0].get<std::vector<int32_t>>();
  };
  std::vector<std::future<std::vector<int32_t>>> answers;
  for (size_t i = 0; i < 3; ++i) answers.push_back(std::async(std::launch::async, ask, i));
  // Mid-stream: malformed JSON, and a well-formed request no rank could run.
  const auto bad = server.put_api(R"({"prompts": ["1 2"], "tokens_to_generate": )");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  const auto too_long = server.put_api(R"({"prompts": ["1 2"], "tokens_to_generate": 40})");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(answers[i].get(), want[i]) << "prompt " << i;
  EXPECT_EQ(ask(3), want[3]) << server.log();
  // SIGTERM to the launcher: rank 0 stops the server and ends the other ranks, which wait for
  // its word (mpirun, which forwards the signal, reports a signalled job with status 1).
  server.stop();
  EXPECT_TRUE(WIFEXITED(server.status())) << server.status() << "\n" << server.log();
  EXPECT_NE(server.log().find("stopped: all 4 ranks have finished"), std::string::npos)
      << server.log();  // SIGTERM to the launcher: every rank exits 0
}

// `evaluate` (tasks/main.py --task WIKITEXT103) on TP2 x PP2 ranks and on PP2 x DP2 ranks (two
// replicas splitting the windows) scores what one process scores.
TEST(ModelParallelEvaluate, TensorPipelineAndDataParallelRanksScoreAsOneProcess) {
  const Checkpoints ck(testing::gpt2_config());
  std::string text;
  for (int i = 0; i < 150; ++i) text += std::to_string((i * 37 + 11) % 60) + " ";
  const fs::path data = ck.dir.path() / "wiki.test.tokens";
  mt::write_file(data, text + "\n");
  auto run = [&](int tp, int pp, int ranks) {
    const std::string launch = ranks == 1 ? "" : str("launch --nproc-per-node ", ranks, " -- ");
    const auto r = mt::run_command(str(
        "OMP_NUM_THREADS=1 '", mt::cli_path().string(), "' ", launch, "evaluate --load ",
        ck.path(tp, pp).string(), kTokenizer, " --tensor-model-parallel-size ", tp,
        " --pipeline-model-parallel-size ", pp, " --task WIKITEXT103 --valid-data ",
        data.string(), " --overlapping-eval 16 --micro-batch-size 2 2>&1"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.output, m, std::regex(R"(loss sum (\S+) nats)"))) << r.output;
    return std::pair{m.empty() ? -1.0 : std::stod(m[1].str()), r.output};
  };
  const auto [one, one_out] = run(1, 1, 1);
  ASSERT_GT(one, 0.0) << one_out;
  for (const auto& [tp, pp, ranks] : {std::tuple{2, 2, 4}, {1, 2, 4}}) {
    const auto [many, out] = run(tp, pp, ranks);
    EXPECT_NEAR(many, one, 1e-5 * one) << "TP" << tp << " PP" << pp << " on " << ranks << "\n" << out;
    EXPECT_NE(out.find("validation results on WIKITEXT103"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace megatron::inference
