// build_tokenizer: maps --tokenizer-type to an implementation and checks that the flags the
// chosen type needs were given.
#include "core/error.h"
#include "data/bert_wordpiece.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tiktoken_tokenizer.h"
#include "data/tokenizer.h"

namespace megatron::data {

namespace {

constexpr const char* kSupported =
    "GPT2BPETokenizer, BertWordPieceLowerCase, BertWordPieceCase, SentencePieceTokenizer, "
    "GPTSentencePieceTokenizer, Llama2Tokenizer, HuggingFaceTokenizer, TikTokenizer, "
    "NullTokenizer";

}  // namespace

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& o) {
  MG_REQUIRE(!o.type.empty(), "--tokenizer-type is required (", kSupported, ")");
  MG_REQUIRE(o.vocab_extra_ids >= 0, "--vocab-extra-ids must be >= 0, got ", o.vocab_extra_ids);
  if (o.type == "GPT2BPETokenizer") {
    MG_REQUIRE(!o.vocab_file.empty(),
               "--tokenizer-type GPT2BPETokenizer needs --vocab-file "
               "(GPT-2's encoder.json, e.g. gpt2-vocab.json)");
    MG_REQUIRE(!o.merge_file.empty(),
               "--tokenizer-type GPT2BPETokenizer needs --merge-file "
               "(GPT-2's vocab.bpe, e.g. gpt2-merges.txt)");
    return std::make_unique<GPT2BPETokenizer>(o.vocab_file, o.merge_file);
  }
  if (o.type == "BertWordPieceLowerCase" || o.type == "BertWordPieceCase") {
    MG_REQUIRE(!o.vocab_file.empty(), "--tokenizer-type ", o.type,
               " needs --vocab-file (BERT's vocab.txt, one token per line)");
    return std::make_unique<BertWordPieceTokenizer>(
        o.vocab_file, o.type == "BertWordPieceLowerCase", o.vocab_extra_ids);
  }
  using Flavor = SentencePieceTokenizer::Flavor;
  for (auto [name, flavor] : {std::pair{"SentencePieceTokenizer", Flavor::kSentencePiece},
                              std::pair{"GPTSentencePieceTokenizer", Flavor::kGPTSentencePiece},
                              std::pair{"Llama2Tokenizer", Flavor::kLlama2}}) {
    if (o.type != name) continue;
    MG_REQUIRE(!o.tokenizer_model.empty(), "--tokenizer-type ", name,
               " needs --tokenizer-model (a SentencePiece model, e.g. Llama-2's tokenizer.model)");
    return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, flavor,
                                                    flavor == Flavor::kSentencePiece ? o.vocab_extra_ids : 0);
  }
  if (o.type == "HuggingFaceTokenizer") return std::make_unique<HuggingFaceTokenizer>(o.tokenizer_model);
  if (o.type == "TikTokenizer") {
    TikTokenizer::Options t;
    t.ranks_file = o.tokenizer_model;
    t.pattern = o.tiktoken_pattern;
    t.vocab_size = o.vocab_size;
    t.num_special_tokens = o.tiktoken_num_special_tokens;
    t.special_tokens = o.special_tokens;
    return std::make_unique<TikTokenizer>(t);
  }
  if (o.type == "NullTokenizer") {
    MG_REQUIRE(o.vocab_size > 0, "--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(o.vocab_size);
  }
  MG_THROW("unknown --tokenizer-type '", o.type, "' (supported: ", kSupported, ")");
}

}  // namespace megatron::data
