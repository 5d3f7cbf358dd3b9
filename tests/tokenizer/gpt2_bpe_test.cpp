// GPT2BPETokenizer: the pre-tokenizer against hand-derived splits of GPT-2's regex, BPE on a
// hand-made vocabulary, known GPT-2 ids (when the demo files are present), UTF-8 repair in
// decode, and clear errors for bad vocab/merges files.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "data/gpt2_bpe.h"
#include "data/unicode.h"
#include "test_util.h"
#include "tokenizer/stress_text.h"

namespace megatron::data {
namespace {

using megatron::testing::TempDir;
using megatron::testing::write_file;

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (auto p : GPT2BPETokenizer::pretokenize(text)) out.emplace_back(p);
  return out;
}
using V = std::vector<std::string>;

TEST(Gpt2Pretokenize, WordsSpacesAndContractions) {
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm he's don't we'll you've they're I'd"),
            (V{"I", "'m", " he", "'s", " don", "'t", " we", "'ll", " you", "'ve", " they", "'re",
               " I", "'d"}));
  // Contractions are lower-case only; an upper-case 'S is punctuation then a letter.
  EXPECT_EQ(pieces("IT'S"), (V{"IT", "'", "S"}));
  EXPECT_EQ(pieces("a 's"), (V{"a", " '", "s"}));
  EXPECT_EQ(pieces("'''"), (V{"'''"}));
  EXPECT_EQ(pieces("123abc 42!! ?! ."), (V{"123", "abc", " 42", "!!", " ?!", " ."}));
  EXPECT_EQ(pieces("café naïve"), (V{"café", " naïve"}));
}

TEST(Gpt2Pretokenize, WhitespaceRunsLeaveTheirLastCharacter) {
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces("x\t\ty"), (V{"x", "\t", "\t", "y"}));
  EXPECT_EQ(pieces("x   "), (V{"x", "   "}));
  EXPECT_EQ(pieces("   "), (V{"   "}));
  EXPECT_EQ(pieces(" "), (V{" "}));
  EXPECT_EQ(pieces("a\r\n\r\nb"), (V{"a", "\r\n\r", "\n", "b"}));
  // U+00A0 and U+3000 are White_Space but not ' ': alone they take the "\s+" branch.
  EXPECT_EQ(pieces("a\u00a0b"), (V{"a", "\u00a0", "b"}));
  EXPECT_EQ(pieces("a \u3000b"), (V{"a", " ", "\u3000", "b"}));
  EXPECT_EQ(pieces(""), V{});
}

TEST(Gpt2Pretokenize, InvalidBytesArePunctuationCharacters) {
  EXPECT_EQ(pieces("a\xff"
                   "b"),
            (V{"a", "\xff", "b"}));
  EXPECT_EQ(pieces("!\xc3!"), (V{"!\xc3!"}));
  EXPECT_EQ(pieces(" \x80x"), (V{" \x80", "x"}));
}

// GPT-2's byte-to-unicode character for byte b, as UTF-8.
std::string byte_char(int b) {
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int extra = 0;
  for (int k = 0; k < b; ++k)
    if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) ++extra;
  std::string s;
  unicode::append_utf8(s, printable ? b : 256 + extra);
  return s;
}

// 256 byte tokens (id = byte) plus "he"=256, "ll"=257, "hell"=258, "Ġw"=259, "<|endoftext|>"=260.
struct TinyVocab {
  TempDir dir;
  std::string vocab = (dir / "vocab.json").string();
  std::string merges = (dir / "merges.txt").string();
  TinyVocab() {
    nlohmann::json v;
    for (int b = 0; b < 256; ++b) v[byte_char(b)] = b;
    v["he"] = 256;
    v["ll"] = 257;
    v["hell"] = 258;
    v[byte_char(' ') + "w"] = 259;
    v["<|endoftext|>"] = 260;
    write_file(vocab, v.dump());
    write_file(merges, "#version: 0.2\nl l\nh e\nhe ll\n" + byte_char(' ') + " w\n");
  }
};

TEST(Gpt2Bpe, MergesByRankOnATinyVocabulary) {
  TinyVocab t;
  GPT2BPETokenizer tok(t.vocab, t.merges);
  EXPECT_EQ(tok.vocab_size(), 261);
  EXPECT_EQ(tok.eod(), 260);
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{258, 'o'}));
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{258, 'o', 259, 'o', 'r', 'l', 'd'}));
  // "lll": the best pair (l,l) merges left to right -> "ll", "l".
  EXPECT_EQ(tok.encode("lll"), (std::vector<int32_t>{257, 'l'}));
  // Special-token text is ordinary text.
  EXPECT_EQ(tok.encode("<|endoftext|>").size(), 13u);
  EXPECT_EQ(tok.decode(tok.encode("hello world")), "hello world");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{260}), "<|endoftext|>");
}

TEST(Gpt2Bpe, DecodeReplacesInvalidUtf8LikePython) {
  TinyVocab t;
  GPT2BPETokenizer tok(t.vocab, t.merges);
  // Bytes are ids here. Python: b"a\xe2\x82b\xff\xf0\x9f\x98".decode(errors="replace")
  //   == "a\ufffdb\ufffd\ufffd"
  std::vector<int32_t> ids = {'a', 0xE2, 0x82, 'b', 0xFF, 0xF0, 0x9F, 0x98};
  EXPECT_EQ(tok.decode(ids), "a\uFFFDb\uFFFD\uFFFD");
  // b"\xed\xa0\x80\xc0\xaf".decode(errors="replace") == 5 x U+FFFD (surrogate, overlong).
  std::vector<int32_t> bad = {0xED, 0xA0, 0x80, 0xC0, 0xAF};
  EXPECT_EQ(tok.decode(bad), "\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{261}), Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), Error);
  // Invalid input bytes survive a round trip as bytes.
  std::string raw = "x\xff\xfe y";
  std::string back;
  for (int32_t id : tok.encode(raw)) back += tok.token_bytes(id);
  EXPECT_EQ(back, raw);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Gpt2Bpe, BadFilesNameTheFileAndLine) {
  TinyVocab t;
  EXPECT_NE(error_of([&] {
              GPT2BPETokenizer("/nonexistent/v.json", t.merges);
            }).find("/nonexistent/v.json"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { GPT2BPETokenizer(t.vocab, "/nonexistent/m.txt"); }).find("/nonexistent/m.txt"),
      std::string::npos);
  TempDir d;
  write_file(d / "bad.json", "{\n\"a\": 1,\n\"b\": }\n");
  std::string e = error_of([&] { GPT2BPETokenizer((d / "bad.json").string(), t.merges); });
  EXPECT_NE(e.find("bad.json' line 3"), std::string::npos) << e;
  write_file(d / "nobytes.json", "{\"a\": 0}");
  e = error_of([&] { GPT2BPETokenizer((d / "nobytes.json").string(), t.merges); });
  EXPECT_NE(e.find("256 byte tokens"), std::string::npos) << e;
  write_file(d / "bigid.json", "{\"a\": 3000000000}");
  e = error_of([&] { GPT2BPETokenizer((d / "bigid.json").string(), t.merges); });
  EXPECT_NE(e.find("token 'a' must map to an integer id"), std::string::npos) << e;
  write_file(d / "m1.txt", "#version: 0.2\nl l\nh e x\n");
  e = error_of([&] { GPT2BPETokenizer(t.vocab, (d / "m1.txt").string()); });
  EXPECT_NE(e.find("m1.txt' line 3"), std::string::npos) << e;
  write_file(d / "m2.txt", "l l\no o\n");
  e = error_of([&] { GPT2BPETokenizer(t.vocab, (d / "m2.txt").string()); });
  EXPECT_NE(e.find("m2.txt' line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("not in --vocab-file"), std::string::npos) << e;
}

// A merges file that does not make every token of the vocabulary (empty, cut at a line boundary,
// a line missing, lines out of order) is refused, naming tokens no merge makes, instead of
// tokenizing into several times as many tokens.
TEST(Gpt2Bpe, IncompleteMergesFilesAreRefused) {
  TinyVocab t;
  TempDir d;
  auto refused = [&](const std::string& merges, const std::string& vocab = "") {
    write_file(d / "m.txt", merges);
    return error_of([&] { GPT2BPETokenizer(vocab.empty() ? t.vocab : vocab, (d / "m.txt").string()); });
  };
  std::string e = refused("#version: 0.2\n");
  EXPECT_NE(e.find("has 0 merges, but 4 tokens of --vocab-file"), std::string::npos) << e;
  EXPECT_NE(e.find("'he', 'll', 'hell', ' w'"), std::string::npos) << e;  // <|endoftext|> is special
  e = refused("#version: 0.2\nl l\nh e\nhe ll\n");  // the last line missing
  EXPECT_NE(e.find("1 tokens of --vocab-file"), std::string::npos) << e;
  EXPECT_NE(e.find("(' w')"), std::string::npos) << e;
  e = refused("#version: 0.2\nhe ll\nl l\nh e\n" + byte_char(' ') + " w\n");  // out of order
  EXPECT_NE(e.find("merge 1 ('he' + 'll') uses a token that no earlier merge makes"), std::string::npos) << e;

  auto dir = megatron::testing::source_dir() / ".cache" / "gpt2";
  ASSERT_TRUE(std::filesystem::exists(dir / "gpt2-merges.txt")) << "run scripts/get-corpus.sh";
  const std::string vocab = (dir / "gpt2-vocab.json").string();
  const std::string full = megatron::testing::read_file(dir / "gpt2-merges.txt");
  size_t cut = 0;
  for (int line = 0; line < 25001; ++line) cut = full.find('\n', cut) + 1;  // half the merges
  e = refused(full.substr(0, cut), vocab);
  EXPECT_NE(e.find("has 25000 merges, but 2"), std::string::npos) << e;  // ~25000 tokens unmade
  e = refused(full.substr(0, full.rfind('\n', full.size() - 2) + 1), vocab);  // one line short
  EXPECT_NE(e.find("has 49999 merges, but 1 tokens"), std::string::npos) << e;
  EXPECT_NE(refused("", vocab).find("has 0 merges"), std::string::npos);
  // One line repeated (the later rank would win and GPT-2's tokens change): refused, naming both.
  e = refused("#version: 0.2\nl l\nh e\nhe ll\n" + byte_char(' ') + " w\nh e\n");
  EXPECT_NE(e.find("m.txt' line 6: 'h e' repeats line 3"), std::string::npos) << e;
  const size_t fifth = full.find('\n', full.find('\n', full.find('\n', full.find('\n') + 1) + 1) + 1) + 1;
  const std::string line5 = full.substr(fifth, full.find('\n', fifth) + 1 - fifth);
  e = refused(full + line5, vocab);
  EXPECT_NE(e.find("line 50002: '" + line5.substr(0, line5.size() - 1) + "' repeats line 5"),
            std::string::npos) << e;
}

// Known GPT-2 ids (tiktoken gpt2), when scripts/get-corpus.sh has fetched the real files.
TEST(Gpt2Bpe, KnownGpt2Ids) {
  auto dir = megatron::testing::source_dir() / ".cache" / "gpt2";
  ASSERT_TRUE(std::filesystem::exists(dir / "gpt2-vocab.json"))
      << "GPT-2 vocab missing: run scripts/get-corpus.sh";
  GPT2BPETokenizer tok((dir / "gpt2-vocab.json").string(), (dir / "gpt2-merges.txt").string());
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eod(), 50256);
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok.encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok.token_text(50256), "<|endoftext|>");
}

// One instance shared by several threads (as preprocess-data's workers share it) gives the same
// ids as one thread; each thread has its own piece cache, and two instances on one thread do
// not see each other's cache.
TEST(Gpt2Bpe, SharedAcrossThreadsAndInstances) {
  TinyVocab t;
  auto dir = megatron::testing::source_dir() / ".cache" / "gpt2";
  ASSERT_TRUE(std::filesystem::exists(dir / "gpt2-vocab.json"))
      << "GPT-2 vocab missing: run scripts/get-corpus.sh";
  GPT2BPETokenizer tok((dir / "gpt2-vocab.json").string(), (dir / "gpt2-merges.txt").string());
  GPT2BPETokenizer tiny(t.vocab, t.merges);
  const auto docs = stress_documents();
  std::vector<std::vector<int32_t>> want;
  for (const auto& d : docs) want.push_back(tok.encode(d));
  EXPECT_EQ(tiny.encode("hello"), (std::vector<int32_t>{258, 'o'}));
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{31373}));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th)
    threads.emplace_back([&, th] {
      for (int round = 0; round < 2; ++round)
        for (size_t i = th; i < docs.size(); i += 2)
          mismatches[th] += tok.encode(docs[i]) != want[i];
    });
  for (auto& th : threads) th.join();
  for (int th = 0; th < 4; ++th) EXPECT_EQ(mismatches[th], 0) << "thread " << th;
}

}  // namespace
}  // namespace megatron::data
