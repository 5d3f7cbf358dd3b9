// build_tokenizer: maps --tokenizer-type to an implementation.
#include "core/error.h"
#include "data/tokenizer.h"

namespace megatron::data {

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& o) {
  if (o.type == "NullTokenizer") {
    MG_REQUIRE(o.vocab_size > 0, "--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(o.vocab_size);
  }
  MG_REQUIRE(!o.type.empty(), "--tokenizer-type is required");
  MG_THROW("unknown --tokenizer-type '", o.type,
           "' (supported: GPT2BPETokenizer, BertWordPieceLowerCase, BertWordPieceCase, "
           "NullTokenizer)");
}

}  // namespace megatron::data
