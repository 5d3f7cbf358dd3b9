// libFuzzer target: HuggingFaceTokenizer from a tokenizer.json (src/data/hf_tokenizer.h). The
// input is the file's text, then optionally a NUL byte and a text to encode; the file is written to
// /dev/shm (or $FUZZ_TMPDIR). A tokenizer that loads encodes the text into ids it can decode (and
// the default sample text when there is none); anything else is a megatron::Error. Bounded: the
// nesting depth, the number of normalizer and pre-tokenizer steps and the normalizers' expansion
// are limited, so no input may take more than libFuzzer's -rss_limit_mb or -timeout.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fuzz_scratch.h"
#include "data/hf_tokenizer.h"

namespace {

const std::string& path() {
  static const std::string p = fuzz_scratch_path("tokenizer.json");
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_len = nul ? size_t(nul - data) : size;
  {
    std::ofstream f(path(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(json_len));
  }
  const std::string text = nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - json_len - 1)
                               : std::string("Hello world, héllo wörld! 123 <|endoftext|>\n\tabc");
  try {
    const megatron::data::HuggingFaceTokenizer tok(path());
    try {
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids)
        if (id < 0) std::abort();
      (void)tok.decode(ids);
    } catch (const megatron::Error&) {
      // e.g. the normalizers' expansion limit
    }
  } catch (const megatron::Error&) {
  }
  return 0;
}
