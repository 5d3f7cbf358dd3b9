// The SentencePiece and Hugging Face tokenizer types end to end beyond preprocess-data: data
// preprocessed with the tokenizer, a tiny GPT trained on it by `megatron pretrain-gpt` (which
// sizes the vocabulary from the tokenizer), then `megatron generate` with the same
// --tokenizer-type: the output's first ids are the reference library's ids of the prompt, and its
// text is the reference's decode of all its ids (prompt + greedy continuation); and
// `megatron evaluate --task WIKITEXT103` counts as many tokens in the detokenized WikiText as the
// reference gives the same text (Megatron's WikiText detokenizer written out in Python,
// tests/reference/zeroshot_reference.py).
//  - Llama2Tokenizer (BOS first) and SentencePieceTokenizer (Megatron's added <SEP>, <EOD>, ...)
//    on a BPE SentencePiece model trained here, against python3-sentencepiece with Megatron's
//    wrappers (tests/reference/sentencepiece_reference.py);
//  - HuggingFaceTokenizer on the Qwen2-style tokenizer.json of tests/reference/tiktoken_ranks.mjs
//    (NFC normalizer, special and non-special added tokens), against that program's own
//    implementation over tiktoken.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "json_lines.h"
#include "test_util.h"
#include "tokenizer/parity_util.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// Preprocesses 150 nlp-corpus documents with `tokenizer` (flags) and trains a 1-layer GPT on them
// for 3 iterations into dir/ckpt.
void train(const fs::path& dir, const std::string& tokenizer) {
  const fs::path nlp = mt::source_dir() / ".cache/corpus/nlp.jsonl";
  ASSERT_TRUE(fs::exists(nlp)) << "run scripts/get-corpus.sh";
  auto docs = parity::read_jsonl_texts(nlp);
  docs.resize(std::min<size_t>(docs.size(), 150));
  parity::write_jsonl_texts(dir / "corpus.jsonl", docs);
  auto r = mt::run_cli("preprocess-data --input " + q(dir / "corpus.jsonl") + " --output-prefix " +
                       q(dir / "corpus") + tokenizer + " --append-eod --workers 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mt::run_cli("--log-level warn pretrain-gpt --num-layers 1 --hidden-size 32 --num-attention-heads 4"
                  " --seq-length 32 --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 4"
                  " --train-iters 3 --lr 1e-2 --hidden-dropout 0 --attention-dropout 0 --data-path " +
                  q(dir / "corpus_text_document") + " --split 100,0,0" + tokenizer +
                  " --eval-iters 0 --eval-interval 1000 --log-interval 1000 --save " + q(dir / "ckpt") +
                  " --save-interval 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// `megatron generate` on dir/ckpt: each prompt's {"tokens", "text"}.
std::vector<json> generate(const fs::path& dir, const std::string& tokenizer,
                           const std::vector<std::string>& prompts) {
  std::string cmd = "--log-level warn generate --load " + q(dir / "ckpt") + " --use-checkpoint-args" + tokenizer +
                    " --num-tokens-to-generate 5 --top_k 1 --output-format jsonl";
  for (const std::string& p : prompts) cmd += " --prompt " + q(p);
  const auto r = mt::run_cli(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out = mt::json_lines(r.output);
  EXPECT_EQ(out.size(), prompts.size()) << r.output;
  return out;
}

// The reference's decode of every output's ids (`decode_cmd`: the reference command line up to
// the ids file) and its ids of the prompts (`encode_cmd`: up to the output options).
void expect_reference(const fs::path& dir, const std::vector<std::string>& prompts, const std::vector<json>& gen,
                      const std::string& encode_cmd, const std::string& decode_cmd) {
  ASSERT_EQ(gen.size(), prompts.size());
  parity::write_jsonl_texts(dir / "prompts.jsonl", prompts);
  ASSERT_EQ(parity::run_reference(encode_cmd + " --out " + q(dir / "prompt_ids.bin") + " --decoded " +
                                  q(dir / "prompt_dec.jsonl") + " " + q(dir / "prompts.jsonl")),
            "");
  const auto prompt_ids = parity::read_id_file(dir / "prompt_ids.bin");
  ASSERT_EQ(prompt_ids.size(), prompts.size());
  json lists = json::array();
  for (const json& g : gen) lists.push_back(g["tokens"]);
  mt::write_file(dir / "gen_ids.json", lists.dump());
  const auto r = mt::run_command(decode_cmd + " " + q(dir / "gen_ids.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json texts = json::parse(r.output);
  ASSERT_EQ(texts.size(), gen.size());
  for (size_t i = 0; i < gen.size(); ++i) {
    const auto tokens = gen[i]["tokens"].get<std::vector<int32_t>>();
    ASSERT_EQ(tokens.size(), prompt_ids[i].size() + 5) << gen[i].dump();
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + long(prompt_ids[i].size()));
    EXPECT_EQ(parity::first_difference(prompt, prompt_ids[i]), "") << "prompt " << i;
    EXPECT_EQ(gen[i]["text"].get<std::string>(), texts[i].get<std::string>()) << "prompt " << i;
    EXPECT_EQ(gen[i]["prompt"].get<std::string>(), prompts[i]);
  }
}

// `megatron evaluate --task WIKITEXT103` on dir/ckpt: its count of the detokenized text's tokens
// equals the reference's (`encode_cmd`, as in expect_reference) for Python's detokenization.
void expect_wikitext_tokens(const fs::path& dir, const std::string& tokenizer, const std::string& encode_cmd) {
  const fs::path file = dir / "wiki.test.tokens";
  mt::write_file(file,
                 " \n = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre "
                 "actor . He had a guest @-@ starring role in 2000 , in ( the 1 @,@ 000 @.@ 5 km ) film "
                 "\" Donkey Punch \" at 20 \u00b0 C ; caf\u00e9 's 3 @.@ 14 . \n \n = = Career = = \n");
  const auto r = mt::run_cli("evaluate --task WIKITEXT103 --valid-data " + q(file) + " --load " + q(dir / "ckpt") +
                             " --use-checkpoint-args" + tokenizer);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(number of detokenized tokens: (\d+))"))) << r.output;
  const auto d = mt::run_command("/usr/bin/python3 " + q(mt::source_dir() / "tests/reference/zeroshot_reference.py") +
                                 " --detokenize " + q(file));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  parity::write_jsonl_texts(dir / "wiki.jsonl", {json::parse(d.output)["wiki"].get<std::string>()});
  ASSERT_EQ(parity::run_reference(encode_cmd + " --out " + q(dir / "wiki_ids.bin") + " --decoded " +
                                  q(dir / "wiki_dec.jsonl") + " " + q(dir / "wiki.jsonl")),
            "");
  const auto ids = parity::read_id_file(dir / "wiki_ids.bin");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(std::stoull(m[1].str()), ids[0].size()) << r.output;
}

TEST(TokenizerGenerate, SentencePieceTypesMatchPythonSentencePiece) {
  mt::TempDir tmp;
  const std::string py = "/usr/bin/python3 " + q(mt::source_dir() / "tests/reference/sentencepiece_reference.py");
  const fs::path brown = mt::source_dir() / ".cache/corpus/brown.jsonl";
  ASSERT_TRUE(fs::exists(brown)) << "run scripts/get-corpus.sh";
  auto docs = parity::read_jsonl_texts(brown);
  std::string text;
  for (size_t d = 0; d < 30 && d < docs.size(); ++d) text += docs[d] + "\n";
  mt::write_file(tmp / "train.txt", text);
  ASSERT_EQ(parity::run_reference(py + " train --input " + q(tmp / "train.txt") + " --model-prefix " +
                                  q(tmp / "sp") + " --model-type bpe --vocab-size 800"),
            "");
  const std::vector<std::string> prompts = {"The jury said that the", "It is caf\u00e9 time<SEP> in"};
  for (const std::string type : {"Llama2Tokenizer", "SentencePieceTokenizer"}) {
    const fs::path dir = tmp / type;
    fs::create_directories(dir);
    const std::string flags = " --tokenizer-type " + type + " --tokenizer-model " + q(tmp / "sp.model");
    train(dir, flags);
    const auto gen = generate(dir, flags, prompts);
    expect_reference(dir, prompts, gen, py + " encode --model " + q(tmp / "sp.model") + " --flavor " + type,
                     py + " decode --model " + q(tmp / "sp.model") + " --flavor " + type);
    if (type == "Llama2Tokenizer") {
      ASSERT_FALSE(gen.empty());
      EXPECT_EQ(gen[0]["tokens"][0], 1) << "BOS first";
      expect_wikitext_tokens(dir, flags, py + " encode --model " + q(tmp / "sp.model") + " --flavor " + type);
    }
  }
}

TEST(TokenizerGenerate, HuggingFaceTokenizerMatchesTheReference) {
  mt::TempDir tmp;
  ASSERT_TRUE(fs::exists(mt::source_dir() / "tests/reference/node_modules/tiktoken")) << "run scripts/node-deps.sh";
  const std::string node = "node " + q(mt::source_dir() / "tests/reference/tiktoken_ranks.mjs");
  ASSERT_EQ(parity::run_reference(node + " hf qwen2 " + q(tmp / "qwen2")), "");
  const std::string flags = " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + q(tmp / "qwen2");
  train(tmp.path(), flags);
  // NFC composes e + U+0301; added tokens (special and not) inside the prompt.
  const std::vector<std::string> prompts = {"<|im_start|>user\nCafe\u0301 costs 2024 euros<|im_end|>\n",
                                            "The jury <tool_call>said</tool_call> that"};
  const auto gen = generate(tmp.path(), flags, prompts);
  expect_reference(tmp.path(), prompts, gen, node + " encode qwen2", node + " decode qwen2");
  ASSERT_FALSE(gen.empty());
  EXPECT_EQ(gen[0]["tokens"][0], 100257) << "<|im_start|>";
  expect_wikitext_tokens(tmp.path(), flags, node + " encode qwen2");
}

}  // namespace
}  // namespace megatron::data
