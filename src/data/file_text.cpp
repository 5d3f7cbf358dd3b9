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

}  // namespace megatron::data
