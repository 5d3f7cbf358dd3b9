// Whole-file reads for tokenizer and vocabulary files, with errors naming the flag and path.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace megatron::data {

// The bytes of `path`; throws megatron::Error naming `flag` (e.g. "--tokenizer-model") when the
// file cannot be opened or read, or is a folder.
std::string read_file_for_flag(const std::string& path, const char* flag);

// 1-based line number of a byte offset (for error messages).
size_t line_at_offset(const std::string& text, size_t offset);

// JSON `text` parsed with its nesting bounded: deeper than `max_depth` levels is an error naming
// `what` (the file and flag) and the limit, raised while parsing, before a deep document is built.
// Malformed JSON is an error naming `what` and the line.
nlohmann::json parse_json_bounded(const std::string& text, const std::string& what, int max_depth);

}  // namespace megatron::data
