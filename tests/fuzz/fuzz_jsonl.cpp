// libFuzzer target: preprocess-data's JSONL record reading (src/data/preprocess.h): the UTF-8
// check, then the JSON parse and key extraction. Every line gives its values or a message, never
// an exception; the values are valid UTF-8 (JSON strings decode to UTF-8).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "data/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  if (megatron::data::find_invalid_utf8(line) != std::string_view::npos) return 0;
  static const std::vector<std::string> keys = {"text", "title"};
  nlohmann::json storage;
  std::vector<megatron::data::JsonlValue> values;
  const std::string error = megatron::data::parse_jsonl_record(line, keys, storage, values);
  if (error.empty()) {
    if (values.size() != keys.size()) std::abort();
    for (const auto& v : values)
      for (std::string_view s : v.sentences)
        if (megatron::data::find_invalid_utf8(s) != std::string_view::npos) std::abort();
  }
  return 0;
}
