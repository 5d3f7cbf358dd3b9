// BERT WordPiece tokenizers on a hand-made vocab.txt: basic tokenization (cleaning, CJK,
// punctuation, lower-casing and accent stripping), greedy longest-match WordPiece, the special
// ids Megatron adds ([BOS], [EOS], <extra_id_k>), decode, build_tokenizer, and bad files.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/bert_wordpiece.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using megatron::testing::TempDir;
using megatron::testing::write_file;
using V = std::vector<std::string>;
using Ids = std::vector<int32_t>;

// id = line index
const char* kVocab =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"        // 0-4
    "the\nquick\nfox\n##es\nun\n##aff\n##able\n"  // 5-11
    ",\n.\ncafe\nhello\n中\nUN\n##af\n"           // 12-18
    "\u03bf\u03bb\u03bf\u03c2\n";                 // 19 (ends in final sigma)

struct Fixture {
  TempDir dir;
  std::string path = (dir / "vocab.txt").string();
  Fixture() { write_file(path, kVocab); }
};

TEST(BertWordPiece, LowerCaseBasicTokenizer) {
  Fixture f;
  BertWordPieceTokenizer tok(f.path, /*lower_case=*/true);
  EXPECT_EQ(tok.basic_tokenize("UNaffable Foxes, the Café!"),
            (V{"unaffable", "foxes", ",", "the", "cafe", "!"}));
  EXPECT_EQ(tok.basic_tokenize("he\x01llo\u00a0wo\u200brld\t\n中文x"),
            (V{"hello", "world", "中", "文", "x"}));
  EXPECT_EQ(tok.basic_tokenize("ΟΛΟΣ [CLS]"), (V{"\u03bf\u03bb\u03bf\u03c2", "[", "cls", "]"}));
  EXPECT_EQ(tok.basic_tokenize("a\xff"
                               "b \uFFFD"),
            (V{"ab"}));
}

TEST(BertWordPiece, LowerCaseIds) {
  Fixture f;
  BertWordPieceTokenizer tok(f.path, true);
  EXPECT_EQ(tok.encode("UNaffable Foxes, the Café!"), (Ids{9, 10, 11, 7, 8, 12, 5, 14, 1}));
  EXPECT_EQ(tok.encode("中文 ΟΛΟΣ"), (Ids{16, 1, 19}));
  // Unmatched rest -> the whole word is [UNK].
  EXPECT_EQ(tok.encode("foxy"), (Ids{1}));
  EXPECT_EQ(tok.encode(std::string(201, 'a')), (Ids{1}));
  EXPECT_EQ(tok.encode(""), Ids{});
  EXPECT_EQ(tok.decode(Ids{9, 10, 11, 7, 8, 12}), "unaffable foxes ,");
  EXPECT_EQ(tok.type(), "BertWordPieceLowerCase");
}

TEST(BertWordPiece, CasedKeepsCaseAndAccents) {
  Fixture f;
  BertWordPieceTokenizer tok(f.path, /*lower_case=*/false);
  EXPECT_EQ(tok.basic_tokenize("UNaffable Café"), (V{"UNaffable", "Café"}));
  // "UNaf" = "UN" + "##af"; "Café" has no matching prefix -> [UNK].
  EXPECT_EQ(tok.encode("UNaf the Café"), (Ids{17, 18, 5, 1}));
  EXPECT_EQ(tok.type(), "BertWordPieceCase");
}

TEST(BertWordPiece, SpecialIdsFollowMegatron) {
  Fixture f;
  BertWordPieceTokenizer tok(f.path, true, /*vocab_extra_ids=*/3);
  EXPECT_EQ(tok.pad(), 0);
  EXPECT_EQ(tok.cls(), 2);
  EXPECT_EQ(tok.sep(), 3);
  EXPECT_EQ(tok.mask(), 4);
  EXPECT_EQ(tok.bos(), 20);
  EXPECT_EQ(tok.eos(), 21);
  EXPECT_EQ(tok.eod(), 21);
  EXPECT_EQ(tok.vocab_size(), 25);
  EXPECT_EQ(tok.token(24), "<extra_id_2>");
  // [BOS]/[EOS] already in the file keep their ids.
  TempDir d;
  write_file(d / "v.txt", std::string(kVocab) + "[EOS]\n[BOS]\n");
  BertWordPieceTokenizer tok2((d / "v.txt").string(), true);
  EXPECT_EQ(tok2.bos(), 21);
  EXPECT_EQ(tok2.eos(), 20);
  EXPECT_EQ(tok2.vocab_size(), 22);
}

TEST(BertWordPiece, BuildTokenizer) {
  Fixture f;
  TokenizerOptions o;
  o.type = "BertWordPieceCase";
  EXPECT_THROW(build_tokenizer(o), Error);  // no --vocab-file
  o.vocab_file = f.path;
  auto tok = build_tokenizer(o);
  EXPECT_EQ(tok->type(), "BertWordPieceCase");
  EXPECT_EQ(tok->vocab_size(), 22);
  o.type = "GPT2BPETokenizer";
  EXPECT_THROW(build_tokenizer(o), Error);  // no --merge-file
  o.type = "NoSuchTokenizer";
  EXPECT_THROW(build_tokenizer(o), Error);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(BertWordPiece, BadVocabFiles) {
  TempDir d;
  std::string e = error_of([&] { BertWordPieceTokenizer((d / "missing.txt").string(), true); });
  EXPECT_NE(e.find("missing.txt"), std::string::npos) << e;
  write_file(d / "nomask.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n");
  e = error_of([&] { BertWordPieceTokenizer((d / "nomask.txt").string(), true); });
  EXPECT_NE(e.find("[MASK]"), std::string::npos) << e;
  write_file(d / "dup.txt", "[PAD]\n[UNK]\nthe\n[CLS]\nthe\n");
  e = error_of([&] { BertWordPieceTokenizer((d / "dup.txt").string(), true); });
  EXPECT_NE(e.find("dup.txt' line 5"), std::string::npos) << e;
  write_file(d / "utf.txt", "[PAD]\n\xff\xfe\n");
  e = error_of([&] { BertWordPieceTokenizer((d / "utf.txt").string(), true); });
  EXPECT_NE(e.find("utf.txt' line 2"), std::string::npos) << e;
  Fixture f;
  BertWordPieceTokenizer tok(f.path, true);
  EXPECT_THROW(tok.decode(Ids{22}), Error);
}

}  // namespace
}  // namespace megatron::data
