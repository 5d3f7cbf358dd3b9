// Tokenizer throughput for any --tokenizer-type on one thread, over the texts of a JSONL corpus
// (read and parsed before timing; tokenizer loading excluded). Each round builds a fresh
// tokenizer so per-thread piece caches start cold; prints the best of N rounds as one JSON line.
// bench/tokenize_bench.sh runs it beside the reference programs (tiktoken, python3-sentencepiece).
// Usage: tokenize_bench_any CORPUS.jsonl ROUNDS --tokenizer-type T [--tokenizer-model M]
//        [--tiktoken-pattern v1|v2] [--vocab-size N] [--vocab-file F --merge-file F]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenize_bench_any CORPUS.jsonl ROUNDS --tokenizer-type T ...\n");
    return 2;
  }
  try {
    megatron::data::TokenizerOptions o;
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], v = argv[i + 1];
      if (flag == "--tokenizer-type") o.type = v;
      else if (flag == "--tokenizer-model") o.tokenizer_model = v;
      else if (flag == "--tiktoken-pattern") o.tiktoken_pattern = v;
      else if (flag == "--vocab-size") o.vocab_size = std::stoll(v);
      else if (flag == "--vocab-file") o.vocab_file = v;
      else if (flag == "--merge-file") o.merge_file = v;
      else MG_THROW("unknown flag ", flag);
    }
    std::ifstream f(argv[1]);
    MG_REQUIRE(f.good(), "cannot open corpus '", argv[1], "'");
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      bytes += texts.back().size();
    }
    const int rounds = std::max(1, std::atoi(argv[2]));
    using clock = std::chrono::steady_clock;
    double best = 1e30;
    size_t tokens = 0;
    std::vector<int32_t> ids;
    for (int r = 0; r < rounds; ++r) {
      auto tok = megatron::data::build_tokenizer(o);
      tokens = 0;
      const auto t0 = clock::now();
      for (const auto& t : texts) {
        ids.clear();
        tok->encode(t, ids);
        tokens += ids.size();
      }
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    std::printf("{\"bytes\":%zu,\"documents\":%zu,\"tokens\":%zu,\"seconds\":%.4f,"
                "\"mb_per_s\":%.2f,\"tokens_per_s\":%.0f}\n",
                bytes, texts.size(), tokens, best, bytes / 1e6 / best, tokens / best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
