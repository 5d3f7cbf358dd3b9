// libFuzzer target: the GPT-2 byte-level BPE tokenizer (src/data/gpt2_bpe.h) with GPT-2's real
// files (.cache/gpt2, or $GPT2_DIR). Any bytes encode to ids in the vocabulary whose bytes are
// the input again (decode(encode(x)) == x for valid UTF-8; token bytes for any bytes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "data/gpt2_bpe.h"
#include "data/unicode.h"

namespace {

const megatron::data::GPT2BPETokenizer& tokenizer() {
  static const auto tok = [] {
    const char* dir = std::getenv("GPT2_DIR");
    const std::string d = dir ? dir : ".cache/gpt2";
    return std::make_unique<megatron::data::GPT2BPETokenizer>(d + "/gpt2-vocab.json",
                                                             d + "/gpt2-merges.txt");
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto& tok = tokenizer();
  const std::vector<int32_t> ids = tok.encode(text);
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
    bytes += tok.token_bytes(id);
  }
  if (bytes != text) std::abort();
  if (tok.decode(ids) != megatron::data::unicode::repair_utf8(text)) std::abort();
  return 0;
}
