// The preprocess-data, merge-datasets and inspect-data commands end to end: outputs, summaries,
// and user mistakes (exit code 1 with a message naming the problem), plus SIGINT, SIGTERM and
// SIGHUP mid-run.
#include <gtest/gtest.h>

#include <filesystem>

#include "data/indexed_dataset.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using megatron::testing::cli_path;
using megatron::testing::run_cli;
using megatron::testing::run_command;
using megatron::testing::TempDir;
using megatron::testing::write_file;
namespace fs = std::filesystem;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
const std::string kNullTokenizer = " --tokenizer-type NullTokenizer --vocab-size 100";
const std::string kNull = kNullTokenizer + " --workers 2";

TEST(DataCli, PreprocessInspectMerge) {
  TempDir dir;
  write_file(dir / "in.jsonl", "{\"text\": \"1 2 3\"}\n{\"text\": \"\"}\n{\"text\": \"4 5\"}\n");
  auto r = run_cli("preprocess-data --input " + q(dir / "in.jsonl") + " --output-prefix " +
                   q(dir / "a") + kNull + " --append-eod");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("documents: 3 (empty: 1, skipped: 0), tokens: 7"), std::string::npos) << r.output;
  // Progress lines every --log-interval documents (stderr is not a terminal here).
  r = run_cli("preprocess-data --input " + q(dir / "in.jsonl") + " --output-prefix " +
              q(dir / "b") + kNull + " --log-interval 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("processed 3 documents ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MB/s"), std::string::npos) << r.output;
  r = run_cli("inspect-data " + q(dir / "a_text_document"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("documents: 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens:    7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("min 0, p50 3, p90 4, p99 4, max 4"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("unigram entropy"), std::string::npos) << r.output;  // index only
  // --entropy reads the tokens 1 2 3 99 4 5 99: -(2/7 ln 2/7 + 5/7 ln 1/7) = 1.74786 nats.
  r = run_cli("inspect-data " + q(dir / "a_text_document") + " --entropy");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("unigram entropy: 1.7479 nats/token over 6 distinct tokens"), std::string::npos)
      << r.output;
  r = run_cli("inspect-data " + q(dir / "a_text_document") + " --show 2");
  EXPECT_EQ(r.output, "4 5 99\n");
  r = run_cli("inspect-data " + q(dir / "a_text_document") + " --show 2" + kNullTokenizer);
  EXPECT_EQ(r.output, "4 5 99\n");
  r = run_cli("inspect-data " + q(dir / "a_text_document") + " --show 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--show 3 is out of range"), std::string::npos) << r.output;

  fs::create_directory(dir / "parts");
  for (const char* stem : {"p2", "p1"}) {
    fs::copy_file(dir / "a_text_document.bin", dir / "parts" / (std::string(stem) + ".bin"));
    fs::copy_file(dir / "a_text_document.idx", dir / "parts" / (std::string(stem) + ".idx"));
  }
  r = run_cli("merge-datasets --input " + q(dir / "parts") + " --output-prefix " + q(dir / "m"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.output.find("p1"), r.output.find("p2")) << "stems are merged in sorted order";
  IndexedDataset m((dir / "m").string());
  EXPECT_EQ(m.num_documents(), 6);
  EXPECT_EQ(m.get(3), (std::vector<int32_t>{4, 5, 99}));
  // A stem without its .idx, then a dtype mismatch.
  write_file(dir / "parts" / "p3.bin", "");
  r = run_cli("merge-datasets --input " + q(dir / "parts") + " --output-prefix " + q(dir / "m2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("p3 has a .bin but no .idx"), std::string::npos) << r.output;
  fs::remove(dir / "parts" / "p3.bin");
  {
    IndexedDatasetBuilder b((dir / "parts" / "p3").string(), IndexDType::I32);
    b.finalize();
  }
  r = run_cli("merge-datasets --input " + q(dir / "parts") + " --output-prefix " + q(dir / "m2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("same dtype"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "m2.bin"));
  r = run_cli("merge-datasets --input " + q(dir / "parts") + " --output-prefix " + q(dir / "x" / "m"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  // The output inside the input folder would be folded back in (and could overwrite an input):
  // refused, spelled either way, and nothing is written.
  fs::remove(dir / "parts" / "p3.bin");
  fs::remove(dir / "parts" / "p3.idx");
  for (const fs::path& out : {dir / "parts" / "merged", dir / "parts" / "." / "p1"}) {
    r = run_cli("merge-datasets --input " + q(dir / "parts") + " --output-prefix " + q(out));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("is inside the --input folder"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "parts" / "merged.bin"));
  EXPECT_EQ(IndexedDataset((dir / "parts" / "p1").string()).num_documents(), 3);
}

TEST(DataCli, UserMistakesExitOne) {
  TempDir dir;
  write_file(dir / "in.jsonl", "{\"text\": \"1\"}\n{\"text\": true}\n");
  const std::string base = "preprocess-data --input " + q(dir / "in.jsonl") + " --output-prefix " + q(dir / "o");
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : std::vector<Case>{
           {base + kNull, "in.jsonl:2: key 'text' has a boolean value"},
           {base + kNull + " --partitions 2", "--partitions 2 is not supported"},
           {base + kNull + " --on-error maybe", "--on-error must be fail or skip"},
           {base + kNull + " --input-format csv", "--input-format must be"},
           {"preprocess-data --input " + q(dir / "none.jsonl") + " --output-prefix o" + kNull, "cannot open --input"},
           {base + " --tokenizer-type NullTokenizer --workers 1", "vocab-size"},
           {"inspect-data " + q(dir / "nothing"), "cannot open index file"},
           {base + kNullTokenizer + " --workers 100000", "--workers 100000 is more threads than is useful"},
       }) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
  auto r = run_cli(base + kNull + " --on-error skip");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipped: 1"), std::string::npos) << r.output;
}

// SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) all stop the run cleanly.
class DataCliSignal : public ::testing::TestWithParam<const char*> {};

TEST_P(DataCliSignal, MidRunLeavesNoOutput) {
  TempDir dir;
  const auto fifo = dir / "in.jsonl";
  ASSERT_EQ(run_command("mkfifo " + q(fifo)).exit_code, 0);
  // The writer keeps the pipe open, so the run is mid-way when SIGINT arrives.
  const std::string script =
      "(printf '{\"text\": \"1 2\"}\\n'; sleep 3) > " + q(fifo) + " & "
      "'" + cli_path().string() + "' preprocess-data --input " + q(fifo) + " --output-prefix " +
      q(dir / "o") + kNull + " & pid=$!; sleep 1.5; kill -" + GetParam() + " $pid; wait $pid; echo rc=$?";
  auto r = run_command("bash -c \"" + [&] {
    std::string s;
    for (char c : script) {
      if (c == '"' || c == '\\' || c == '$') s += '\\';
      s += c;
    }
    return s;
  }() + "\"");
  EXPECT_NE(r.output.find("interrupted"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rc=1"), std::string::npos) << r.output;
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename(), "in.jsonl") << "left behind: " << e.path();
}

INSTANTIATE_TEST_SUITE_P(Signals, DataCliSignal, ::testing::Values("INT", "TERM", "HUP"));

}  // namespace
}  // namespace megatron::data
