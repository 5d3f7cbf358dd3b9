// A tiny WordPiece corpus for the BERT and T5 command tests: 60 documents of four short sentences,
// the vocabulary made from them by the reference WordPiece trainer, and the sentence-split
// indexed dataset `dir/corpus_text_sentence` written by `megatron preprocess-data`.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace megatron::testing {

// Writes dir/corpus.jsonl, dir/vocab.txt and dir/corpus_text_sentence.{bin,idx}; returns the
// tokenizer flags (" --tokenizer-type BertWordPieceLowerCase --vocab-file ...").
inline std::string write_sentence_corpus(const std::filesystem::path& dir) {
  std::string corpus;
  const char* sentences[] = {"The cat sat on the mat.", "A dog ran in the park.",
                             "The sun was warm today.", "We walked to the old town.",
                             "Birds sang in the tall trees.", "It rained late at night."};
  for (int d = 0; d < 60; ++d) {
    std::string text;
    for (int s = 0; s < 4; ++s) text += std::string(sentences[(d + s * 5) % 6]) + " ";
    corpus += nlohmann::json{{"text", text}}.dump() + "\n";
  }
  write_file(dir / "corpus.jsonl", corpus);
  const auto script = (source_dir() / "tests/reference/bert_wordpiece_reference.py").string();
  auto r = run_command("/usr/bin/python3 '" + script + "' make-vocab '" + (dir / "vocab.txt").string() +
                       "' '" + (dir / "corpus.jsonl").string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string tok =
      " --tokenizer-type BertWordPieceLowerCase --vocab-file '" + (dir / "vocab.txt").string() + "'";
  r = run_command(cli_path().string() + " preprocess-data --input '" + (dir / "corpus.jsonl").string() +
                  "' --output-prefix '" + (dir / "corpus").string() + "'" + tok +
                  " --split-sentences --workers 1 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return tok;
}

}  // namespace megatron::testing
