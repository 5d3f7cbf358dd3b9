// TikTokenizer and HuggingFaceTokenizer against OpenAI's tiktoken (npm; its gpt2, cl100k_base
// and o200k_base ranks), through tests/reference/tiktoken_ranks.mjs:
//  - TikTokenizer from the cl100k_base ranks as a .tiktoken file (pattern v1, every rank) and
//    from the o200k_base ranks as Megatron's JSON (pattern v2, cut to the default 131072 - 1000
//    ranks) against tiktoken encodings built the same way, ids shifted past the special tokens;
//  - HuggingFaceTokenizer on tokenizer.json files built from the gpt2 (ByteLevel regex),
//    cl100k_base ("a b" merges) and o200k_base ([a, b] merges, ignore_merges, a BOS template)
//    ranks against tiktoken's own encodings with special tokens parsed;
//  - HuggingFaceTokenizer on a Qwen2-style tokenizer.json (Qwen2's Split pattern: single digits,
//    case-insensitive contractions; an NFC normalizer; Qwen's special and non-special added
//    tokens) on the cl100k_base ranks, against the reference's own implementation of what that
//    file means (added tokens split off, NFC by JavaScript's String.normalize, tiktoken under
//    the Qwen2 pattern); decode against tiktoken's decode.
// Held-out text: 300 nlp-corpus documents and the stress text (emoji, control characters,
// Unicode spaces, long runs without spaces). decode(encode(x)) must give x back (NFC(x) under
// the NFC normalizer).
//
// Invalid UTF-8 (InvalidUtf8IsByteLevelBpeOverTheRawBytes): neither tiktoken nor Hugging Face's
// tokenizers can be given it (they take JavaScript / Python strings), so what the reference
// "does" with it is a choice. Decoding the bytes first with errors='replace' would encode U+FFFD
// characters the input never held and lose the bytes; a byte-level BPE has a token for every
// byte, so ours encodes the raw bytes, and the fair reference is tiktoken on the same bytes:
// every maximal run of valid UTF-8 encoded by tiktoken exactly as text, every maximal run of
// invalid bytes one piece merged by tiktoken's byte-pair rule (the pattern never matches invalid
// bytes and no match crosses them). decode is compared with tiktoken's decode to bytes then
// TextDecoder (one U+FFFD per maximal ill-formed subpart, as Python's errors='replace').
#include <gtest/gtest.h>

#include <filesystem>

#include "data/hf_tokenizer.h"
#include "data/tiktoken_tokenizer.h"
#include "test_util.h"
#include "tokenizer/parity_util.h"
#include "tokenizer/stress_text.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::source_dir;
using megatron::testing::TempDir;

class TiktokenParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    const fs::path nlp = source_dir() / ".cache/corpus/nlp.jsonl";
    ASSERT_TRUE(fs::exists(nlp)) << "run scripts/get-corpus.sh";
    ASSERT_TRUE(fs::exists(source_dir() / "tests/reference/node_modules/tiktoken"))
        << "run scripts/node-deps.sh";
    auto held = parity::read_jsonl_texts(nlp);
    held.resize(std::min<size_t>(held.size(), 300));
    for (auto& d : stress_documents()) held.push_back(d);
    held.push_back("<|endoftext|>a<|endoftext|> <|fim_prefix|>x<|endofprompt|>\n<|endoftext");
    held.push_back("<|im_start|>system\nYou are 42.<|im_end|>\n<|im_start|>user\n<tool_call>{\"a\": 1}"
                   "</tool_call><|im_end|>\u0338 x<\u0338<|im_end|<|im_end|>>");
    parity::write_jsonl_texts(*tmp_ / "held.jsonl", held);
    parity::write_hex_texts(*tmp_ / "invalid.jsonl", invalid_utf8_documents());
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::string ref(const std::string& args) {
    return parity::run_reference("node '" + (source_dir() / "tests/reference/tiktoken_ranks.mjs").string() +
                                 "' " + args);
  }
  static std::string held() { return "'" + (*tmp_ / "held.jsonl").string() + "'"; }

  // Compares ids document by document (with `prefix` before each reference sequence) and checks
  // decode(encode(x)) == decoded_prefix + x, or == the reference's decoded text (`decoded`).
  static void compare(const Tokenizer& tok, const fs::path& ids_file,
                      const std::vector<int32_t>& prefix = {}, const std::string& decoded_prefix = "",
                      const fs::path& decoded = {}) {
    const auto texts = parity::read_jsonl_texts(*tmp_ / "held.jsonl");
    const auto ref_ids = parity::read_id_file(ids_file);
    ASSERT_EQ(ref_ids.size(), texts.size());
    const auto ref_text = decoded.empty() ? texts : parity::read_jsonl_texts(decoded);
    ASSERT_EQ(ref_text.size(), texts.size());
    size_t tokens = 0;
    for (size_t d = 0; d < texts.size(); ++d) {
      auto expected = prefix;
      expected.insert(expected.end(), ref_ids[d].begin(), ref_ids[d].end());
      const auto ours = tok.encode(texts[d]);
      tokens += ours.size();
      ASSERT_EQ(parity::first_difference(ours, expected), "") << tok.type() << " document " << d;
      ASSERT_EQ(tok.decode(ours), decoded_prefix + ref_text[d]) << "round trip of document " << d;
    }
    EXPECT_GT(tokens, 100000u);
  }

  // The ids and decoded text of the invalid-UTF-8 documents against the reference's on the same
  // bytes (`encode_args`: the reference's encode options for this tokenizer).
  static void compare_invalid(const Tokenizer& tok, const std::string& encode_args, const std::string& name) {
    const fs::path ids = *tmp_ / (name + "_invalid.bin"), dec = *tmp_ / (name + "_invalid_dec.jsonl");
    ASSERT_EQ(ref("encode " + encode_args + " --hex --out '" + ids.string() + "' --decoded '" + dec.string() +
                  "' '" + (*tmp_ / "invalid.jsonl").string() + "'"),
              "");
    const auto docs = invalid_utf8_documents();
    const auto ref_ids = parity::read_id_file(ids);
    const auto ref_text = parity::read_jsonl_texts(dec);
    ASSERT_EQ(ref_ids.size(), docs.size());
    ASSERT_EQ(ref_text.size(), docs.size());
    for (size_t d = 0; d < docs.size(); ++d) {
      const auto ours = tok.encode(docs[d]);
      ASSERT_EQ(parity::first_difference(ours, ref_ids[d]), "") << name << " invalid document " << d;
      ASSERT_EQ(tok.decode(ours), ref_text[d]) << name << " decode of invalid document " << d;
    }
  }

  // Writes the reference's file (ranks or tokenizer folder) once for the suite.
  static void ensure(const fs::path& p, const std::string& args) {
    if (!fs::exists(p)) {
      ASSERT_EQ(ref(args), "");
    }
  }

  static TempDir* tmp_;
};
TempDir* TiktokenParity::tmp_ = nullptr;

TEST_F(TiktokenParity, TikTokenizerCl100kRanksFilePatternV1) {
  const fs::path ranks = *tmp_ / "cl100k_base.tiktoken", ids = *tmp_ / "tik_cl100k.bin";
  ensure(ranks, "ranks cl100k_base '" + ranks.string() + "'");
  ASSERT_EQ(ref("encode cl100k_base --pattern v1 --offset 1000 --out '" + ids.string() + "' " + held()), "");
  TikTokenizer::Options o;
  o.ranks_file = ranks.string();
  o.pattern = "v1";
  o.vocab_size = 100256 + 1000;
  TikTokenizer tok(o);
  EXPECT_EQ(tok.vocab_size(), 101256);
  EXPECT_EQ(tok.unk(), 0);
  EXPECT_EQ(*tok.bos(), 1);
  EXPECT_EQ(*tok.eos(), 2);
  EXPECT_EQ(*tok.eod(), 2);
  EXPECT_EQ(tok.token_bytes(3), "<SPECIAL_3>");
  EXPECT_EQ(tok.token_bytes(999), "<SPECIAL_999>");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, 1000 + 'h' - '!', 2}), "<s>h</s>");
  compare(tok, ids);
}

TEST_F(TiktokenParity, TikTokenizerO200kMegatronJsonPatternV2CutToDefaultVocab) {
  const fs::path ranks = *tmp_ / "o200k_base.json", ids = *tmp_ / "tik_o200k.bin";
  ASSERT_EQ(ref("ranks o200k_base '" + ranks.string() + "' --json"), "");
  ASSERT_EQ(ref("encode o200k_base --pattern v2 --cut 130072 --offset 1000 --out '" + ids.string() +
                "' " + held()),
            "");
  TikTokenizer::Options o;
  o.ranks_file = ranks.string();
  o.pattern = "v2";
  o.special_tokens = {"<unk>", "<s>", "</s>", "<mask>"};
  TikTokenizer tok(o);  // --vocab-size unset: Megatron's 131072
  EXPECT_EQ(tok.vocab_size(), 131072);
  EXPECT_EQ(tok.token_bytes(3), "<mask>");
  EXPECT_EQ(tok.token_bytes(4), "<SPECIAL_4>");
  compare(tok, ids);
}

TEST_F(TiktokenParity, HuggingFaceTokenizerGpt2ByteLevelRegex) {
  const fs::path dir = *tmp_ / "hf_gpt2", ids = *tmp_ / "hf_gpt2.bin";
  ensure(dir, "hf gpt2 '" + dir.string() + "'");
  ASSERT_EQ(ref("encode gpt2 --all-special --out '" + ids.string() + "' " + held()), "");
  HuggingFaceTokenizer tok(dir.string());  // the folder
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(*tok.eod(), 50256);
  compare(tok, ids);
}

TEST_F(TiktokenParity, HuggingFaceTokenizerCl100kSplitPattern) {
  const fs::path dir = *tmp_ / "hf_cl100k", ids = *tmp_ / "hf_cl100k.bin";
  ASSERT_EQ(ref("hf cl100k_base '" + dir.string() + "'"), "");
  ASSERT_EQ(ref("encode cl100k_base --all-special --out '" + ids.string() + "' " + held()), "");
  HuggingFaceTokenizer tok((dir / "tokenizer.json").string());
  EXPECT_EQ(tok.vocab_size(), 100256 + 5);
  EXPECT_EQ(*tok.eod(), 100257);
  compare(tok, ids);
}

TEST_F(TiktokenParity, HuggingFaceTokenizerO200kPairMergesIgnoreMergesAndBos) {
  const fs::path dir = *tmp_ / "hf_o200k", ids = *tmp_ / "hf_o200k.bin";
  ASSERT_EQ(ref("hf o200k_base '" + dir.string() +
                "' --merge-pairs --ignore-merges --bos '<|begin_of_text|>:200019'"),
            "");
  ASSERT_EQ(ref("encode o200k_base --all-special --out '" + ids.string() + "' " + held()), "");
  HuggingFaceTokenizer tok(dir.string());
  EXPECT_EQ(*tok.eod(), 199999);
  compare(tok, ids, {200019}, "<|begin_of_text|>");
}

TEST_F(TiktokenParity, HuggingFaceTokenizerQwen2PatternNfcAndAddedTokens) {
  const fs::path dir = *tmp_ / "hf_qwen2", ids = *tmp_ / "hf_qwen2.bin", dec = *tmp_ / "hf_qwen2_dec.jsonl";
  ensure(dir, "hf qwen2 '" + dir.string() + "'");
  ASSERT_EQ(ref("encode qwen2 --out '" + ids.string() + "' --decoded '" + dec.string() + "' " + held()), "");
  HuggingFaceTokenizer tok(dir.string());
  EXPECT_EQ(tok.vocab_size(), 100256 + 8);
  EXPECT_EQ(*tok.eod(), 100256);  // tokenizer_config.json's eos_token <|endoftext|>
  // Single digits (cl100k's pattern takes up to three); the non-special <tool_call> is matched.
  const auto digits = tok.encode("2024");
  EXPECT_EQ(digits.size(), 4u);
  EXPECT_EQ(tok.encode("<tool_call>"), (std::vector<int32_t>{100262}));
  compare(tok, ids, {}, "", dec);
}

TEST_F(TiktokenParity, InvalidUtf8IsByteLevelBpeOverTheRawBytes) {
  const fs::path ranks = *tmp_ / "cl100k_base.tiktoken";
  ensure(ranks, "ranks cl100k_base '" + ranks.string() + "'");
  TikTokenizer::Options o;
  o.ranks_file = ranks.string();
  o.pattern = "v1";
  o.vocab_size = 100256 + 1000;
  compare_invalid(TikTokenizer(o), "cl100k_base --pattern v1 --offset 1000", "tik_cl100k");
  ensure(*tmp_ / "hf_gpt2", "hf gpt2 '" + (*tmp_ / "hf_gpt2").string() + "'");
  compare_invalid(HuggingFaceTokenizer((*tmp_ / "hf_gpt2").string()), "gpt2 --all-special", "hf_gpt2");
  ensure(*tmp_ / "hf_qwen2", "hf qwen2 '" + (*tmp_ / "hf_qwen2").string() + "'");
  compare_invalid(HuggingFaceTokenizer((*tmp_ / "hf_qwen2").string()), "qwen2", "hf_qwen2");
}

}  // namespace
}  // namespace megatron::data
