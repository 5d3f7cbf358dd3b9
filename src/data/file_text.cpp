// Whole-file reads; see file_text.h.
#include "data/file_text.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace megatron::data {

std::string read_file_for_flag(const std::string& path, const char* flag) {
  MG_REQUIRE(!std::filesystem::is_directory(path), flag, " '", path,
             "' is a folder; give the file itself");
  std::ifstream f(path, std::ios::binary);
  MG_REQUIRE(f.good(), "cannot open ", flag, " '", path, "' (check the path)");
  std::ostringstream ss;
  ss << f.rdbuf();
  MG_REQUIRE(!f.bad(), "error reading ", flag, " '", path, "'");
  return ss.str();
}

size_t line_at_offset(const std::string& text, size_t offset) {
  size_t line = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

nlohmann::json parse_json_bounded(const std::string& text, const std::string& what,
                                  int max_depth) {
  const nlohmann::json::parser_callback_t bound = [&](int depth, nlohmann::json::parse_event_t,
                                                      nlohmann::json&) {
    MG_REQUIRE(depth <= max_depth, what, ": JSON nested deeper than ", max_depth,
               " levels (the limit for this file; such nesting is a corrupted or hostile file)");
    return true;
  };
  try {
    return nlohmann::json::parse(text, bound);
  } catch (const nlohmann::json::parse_error& e) {
    MG_THROW(what, " line ", line_at_offset(text, e.byte), ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace megatron::data
