// Megatron's BERT WordPiece vocabulary (_BertWordPieceTokenizer: bert_tokenization.load_vocab,
// then [BOS], [EOS] and <extra_id_k> added when missing) against its Python transcription in
// tests/reference/megatron_bert_dataset.py: the vocabulary size, the special ids, the ids a BERT
// sample's random replacement draws from (token_lookup) and the "##" pieces whole-word masking
// joins.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/bert_wordpiece.h"
#include "data/masked_lm.h"
#include "dataset/bert_test_data.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::testing::TempDir;
using nlohmann::json;

TEST(BertVocabParity, SpecialIdsAndReplacementPoolMatchMegatron) {
  TempDir dir;
  megatron::testing::write_bert_vocab(dir / "plain.txt");
  // [EOS] already in the file (only [BOS] is appended), special tokens not at the front.
  megatron::testing::write_file(dir / "eos.txt", "w0\n##x\n[EOS]\n[MASK]\n[SEP]\n[CLS]\n[UNK]\n[PAD]\n##y\nw1\n");
  struct Case {
    std::string file;
    int extra;
  };
  const std::vector<Case> cases = {{"plain.txt", 0}, {"plain.txt", 3}, {"eos.txt", 0}, {"eos.txt", 2}};
  std::vector<json> reqs;
  for (const auto& c : cases)
    reqs.push_back({{"op", "vocab"}, {"vocab_file", (dir / c.file).string()}, {"vocab_extra_ids", c.extra}});
  auto ans = megatron::testing::ask_bert_reference(reqs);
  ASSERT_EQ(ans.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& want = ans[i];
    for (bool lower : {true, false}) {
      BertWordPieceTokenizer tok((dir / cases[i].file).string(), lower, cases[i].extra);
      EXPECT_EQ(tok.vocab_size(), want["size"].get<int64_t>()) << "case " << i;
      EXPECT_EQ(*tok.bos(), want["bos"].get<int32_t>()) << "case " << i;
      EXPECT_EQ(*tok.eos(), want["eos"].get<int32_t>()) << "case " << i;
      EXPECT_EQ(*tok.eod(), want["eos"].get<int32_t>()) << "case " << i;
      const WordPieceVocab v = wordpiece_vocab(tok);
      EXPECT_EQ(v.cls, want["cls"].get<int32_t>());
      EXPECT_EQ(v.sep, want["sep"].get<int32_t>());
      EXPECT_EQ(v.pad, want["pad"].get<int32_t>());
      EXPECT_EQ(v.mask, want["mask"].get<int32_t>());
      // Random replacements draw randint(0, len(token_lookup)) and use the id at that position:
      // token_lookup must be exactly the ids 0 .. size-1 in order.
      std::vector<int64_t> lookup(size_t(v.size()));
      for (size_t k = 0; k < lookup.size(); ++k) lookup[k] = int64_t(k);
      EXPECT_EQ(json(lookup), want["token_lookup"]) << "case " << i;
      std::vector<int64_t> pieces;
      for (int64_t id = 0; id < v.size(); ++id)
        if (v.continuation[size_t(id)]) pieces.push_back(id);
      EXPECT_EQ(json(pieces), want["continuation"]) << "case " << i;
    }
  }
}

TEST(BertVocabParity, VocabularyWithoutMaskIsRefused) {
  TempDir dir;
  megatron::testing::write_file(dir / "v.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nw0\n");
  auto msg = megatron::testing::error_of([&] { BertWordPieceTokenizer((dir / "v.txt").string(), true); });
  EXPECT_NE(msg.find("[MASK]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("v.txt"), std::string::npos) << msg;
}
