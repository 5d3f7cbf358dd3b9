// The JSON-lines records of a command's output: the lines that open with '{', parsed (the log
// lines around them are skipped).
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace megatron::testing {

inline std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("{")) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace megatron::testing
