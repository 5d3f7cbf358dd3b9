// The tokenizer flags through the megatron binary: preprocess-data with each built-in tokenizer
// type, decoded back by inspect-data --show, and the errors for missing tokenizer files/flags
// (the SentencePiece, Hugging Face and TikToken types run end to end in their parity tests).
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace megatron::testing {
namespace {

std::string q(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

TEST(TokenizerCli, Gpt2PreprocessAndInspectRoundTrip) {
  auto gpt2 = source_dir() / ".cache" / "gpt2";
  ASSERT_TRUE(std::filesystem::exists(gpt2 / "gpt2-vocab.json"))
      << "GPT-2 vocab missing: run scripts/get-corpus.sh";
  TempDir d;
  write_file(d / "in.jsonl",
             "{\"text\": \"Hello world! caf\\u00e9 \\u6771\\u4eac <|endoftext|>\"}\n"
             "{\"text\": \"Second doc.\"}\n");
  const std::string tok = " --tokenizer-type GPT2BPETokenizer --vocab-file " +
                          q(gpt2 / "gpt2-vocab.json") + " --merge-file " +
                          q(gpt2 / "gpt2-merges.txt");
  auto r = run_cli("preprocess-data --input " + q(d / "in.jsonl") + " --output-prefix " +
                   q(d / "out") + " --workers 1 --append-eod" + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli("inspect-data " + q(d / "out_text_document") + " --show 0" + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Hello world! café 東京 <|endoftext|><|endoftext|>"), std::string::npos)
      << r.output;
}

TEST(TokenizerCli, BertPreprocessAndInspect) {
  TempDir d;
  write_file(d / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n!\n");
  write_file(d / "in.jsonl", "{\"text\": \"Hello Worlds!\"}\n");
  const std::string tok =
      " --tokenizer-type BertWordPieceLowerCase --vocab-file " + q(d / "vocab.txt");
  auto r = run_cli("preprocess-data --input " + q(d / "in.jsonl") + " --output-prefix " +
                   q(d / "out") + " --workers 1 --append-eod" + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli("inspect-data " + q(d / "out_text_document") + " --show 0" + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("hello worlds ! [EOS]"), std::string::npos) << r.output;
}

TEST(TokenizerCli, MissingTokenizerFilesAreClearErrors) {
  TempDir d;
  write_file(d / "in.jsonl", "{\"text\": \"x\"}\n");
  const std::string base = "preprocess-data --input " + q(d / "in.jsonl") + " --output-prefix " +
                           q(d / "out") + " --workers 1 --tokenizer-type ";
  auto r = run_cli(base + "GPT2BPETokenizer --vocab-file " + q(d / "v.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("needs --merge-file"), std::string::npos) << r.output;
  r = run_cli(base + "GPT2BPETokenizer --vocab-file " + q(d / "v.json") + " --merge-file " +
              q(d / "m.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("v.json"), std::string::npos) << r.output;
  r = run_cli(base + "BertWordPieceCase");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("needs --vocab-file"), std::string::npos) << r.output;
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
                           "HuggingFaceTokenizer", "TikTokenizer"}) {
    r = run_cli(base + type);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("needs --tokenizer-model"), std::string::npos) << type << ": " << r.output;
  }
  r = run_cli(base + "TikTokenizer --tokenizer-model " + q(d / "ranks.tiktoken"));
  EXPECT_NE(r.output.find("needs --tiktoken-pattern v1 or v2"), std::string::npos) << r.output;
  r = run_cli(base + "TikTokenizer --tokenizer-model " + q(d / "ranks.tiktoken") +
              " --tiktoken-pattern v1");
  EXPECT_NE(r.output.find("cannot open --tokenizer-model"), std::string::npos) << r.output;
  r = run_cli(base + "Llama2Tokenizer --tokenizer-model " + q(d / "in.jsonl"));
  EXPECT_NE(r.output.find("is not a SentencePiece model"), std::string::npos) << r.output;
  r = run_cli(base + "HuggingFaceTokenizer --tokenizer-model " + q(d.path()));
  EXPECT_NE(r.output.find("tokenizer.json does not exist"), std::string::npos) << r.output;
  r = run_cli(base + "FooTokenizer");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown --tokenizer-type"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::testing
