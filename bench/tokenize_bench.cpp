// Tokenizer throughput: GPT2BPETokenizer::encode on one thread over the texts of a JSONL corpus
// (read and parsed before timing). Each round builds a fresh tokenizer so its per-thread piece
// cache starts cold, as in a fresh preprocess-data run; prints the best of N rounds and one
// extra warm-cache pass. Compare with `node tests/reference/tiktoken_gpt2.mjs --bench CORPUS`.
// Usage: tokenize_bench [CORPUS.jsonl] [VOCAB.json] [MERGES.txt] [ROUNDS]
//        (defaults: .cache/corpus/demo.jsonl .cache/gpt2/gpt2-vocab.json
//         .cache/gpt2/gpt2-merges.txt 3)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt2_bpe.h"

int main(int argc, char** argv) {
  std::string corpus = argc > 1 ? argv[1] : ".cache/corpus/demo.jsonl";
  std::string vocab = argc > 2 ? argv[2] : ".cache/gpt2/gpt2-vocab.json";
  std::string merges = argc > 3 ? argv[3] : ".cache/gpt2/gpt2-merges.txt";
  int rounds = argc > 4 ? std::atoi(argv[4]) : 3;
  try {
    std::ifstream f(corpus);
    MG_REQUIRE(f.good(), "cannot open corpus '", corpus, "' (run scripts/get-corpus.sh)");
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      bytes += texts.back().size();
    }
    using clock = std::chrono::steady_clock;
    double best = 1e30, warm = 0;
    size_t tokens = 0;
    std::vector<int32_t> ids;
    for (int r = 0; r < rounds; ++r) {
      megatron::data::GPT2BPETokenizer tok(vocab, merges);
      for (int pass = 0; pass < (r == rounds - 1 ? 2 : 1); ++pass) {
        tokens = 0;
        auto t0 = clock::now();
        for (const auto& t : texts) {
          ids.clear();
          tok.encode(t, ids);
          tokens += ids.size();
        }
        double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (pass == 0)
          best = std::min(best, s);
        else
          warm = s;
      }
    }
    std::printf(
        "{\"bytes\":%zu,\"documents\":%zu,\"tokens\":%zu,\"seconds\":%.4f,"
        "\"mb_per_s\":%.2f,\"tokens_per_s\":%.0f,\"warm_cache_mb_per_s\":%.2f}\n",
        bytes, texts.size(), tokens, best, bytes / 1e6 / best, tokens / best, bytes / 1e6 / warm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
