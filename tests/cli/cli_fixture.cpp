// The cached dataset and trained GPT of the command-line tests; see cli_fixture.h.
#include "cli/cli_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "test_util.h"

namespace megatron::testing {

namespace fs = std::filesystem;

namespace {

void run_or_throw(const std::string& args) {
  const auto r = run_cli(args);
  if (r.exit_code != 0)
    throw std::runtime_error("megatron " + args + " failed (" + std::to_string(r.exit_code) + "):\n" + r.output);
}

void build(const fs::path& dir, const std::string& tokenizer) {
  fs::create_directories(dir);
  // The last 2000 documents of the demo corpus: short ones, so the 949,50,1 split of the
  // tutorials still has test documents.
  std::ifstream in(source_dir() / ".cache" / "corpus" / "demo.jsonl");
  if (!in) throw std::runtime_error("no .cache/corpus/demo.jsonl (run scripts/get-corpus.sh)");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  std::ofstream out(dir / "corpus.jsonl");
  for (size_t i = lines.size() > 2000 ? lines.size() - 2000 : 0; i < lines.size(); ++i) out << lines[i] << "\n";
  out.close();
  run_or_throw("preprocess-data --input " + (dir / "corpus.jsonl").string() + " --output-prefix " +
               (dir / "corpus").string() + tokenizer + " --append-eod --workers 2");
  run_or_throw("--log-level warn pretrain-gpt" + std::string(kFixtureModelFlags) +
               " --micro-batch-size 8 --global-batch-size 8 --train-iters 40 --lr 1e-2 --min-lr 1e-3"
               " --lr-decay-style cosine --lr-warmup-iters 4 --hidden-dropout 0 --attention-dropout 0"
               " --data-path " + (dir / "corpus_text_document").string() + " --split 98,2,0" +
               tokenizer + " --eval-iters 0 --eval-interval 1000 --log-interval 1000 --save " +
               (dir / "ckpt").string() + " --save-interval 40");
}

}  // namespace

const CliFixture& cli_fixture() {
  static CliFixture f = [] {
    CliFixture c;
    const fs::path gpt2 = source_dir() / ".cache" / "gpt2";
    c.vocab_file = (gpt2 / "gpt2-vocab.json").string();
    c.merge_file = (gpt2 / "gpt2-merges.txt").string();
    c.tokenizer_flags = " --tokenizer-type GPT2BPETokenizer --vocab-file " + c.vocab_file +
                        " --merge-file " + c.merge_file;
    const auto stamp = fs::last_write_time(cli_path()).time_since_epoch().count();
    c.dir = fs::path(MG_BINARY_DIR) / "test_cache" / ("cli-" + std::to_string(stamp));
    if (!fs::exists(c.dir / "ckpt" / "latest_checkpointed_iteration.txt")) {
      const fs::path tmp = c.dir.string() + ".tmp" + std::to_string(getpid());
      fs::remove_all(tmp);
      build(tmp, c.tokenizer_flags);
      std::error_code ec;
      fs::rename(tmp, c.dir, ec);  // another process may have won the race: use its copy
      if (ec) fs::remove_all(tmp);
      // Caches of earlier builds of the binary are stale.
      for (const auto& e : fs::directory_iterator(c.dir.parent_path(), ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("cli-", 0) == 0 && name.find(".tmp") == std::string::npos && e.path() != c.dir)
          fs::remove_all(e.path(), ec);
      }
    }
    c.data_prefix = (c.dir / "corpus_text_document").string();
    c.checkpoint = (c.dir / "ckpt").string();
    return c;
  }();
  return f;
}

}  // namespace megatron::testing
