// Helpers shared by the tokenizer parity tests: JSONL corpora in and out, the reference
// programs' id files (per document: uint32 count, then the ids), and an id comparison that
// shows where two sequences part.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"

namespace megatron::data::parity {

inline std::vector<std::string> read_jsonl_texts(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::vector<std::string> texts;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return texts;
}

inline void write_jsonl_texts(const std::filesystem::path& p, const std::vector<std::string>& texts) {
  std::ofstream f(p);
  for (const auto& t : texts) f << nlohmann::json{{"text", t}}.dump() << "\n";
}

// Raw byte strings (which may hold invalid UTF-8, which JSON strings cannot) as {"hex": "..."}
// lines for the reference programs.
inline void write_hex_texts(const std::filesystem::path& p, const std::vector<std::string>& texts) {
  std::ofstream f(p);
  for (const auto& t : texts) {
    std::string hex;
    for (unsigned char c : t) {
      hex += "0123456789abcdef"[c >> 4];
      hex += "0123456789abcdef"[c & 15];
    }
    f << nlohmann::json{{"hex", hex}}.dump() << "\n";
  }
}

// The documents of a reference id file.
inline std::vector<std::vector<int32_t>> read_id_file(const std::filesystem::path& p) {
  const std::string bin = megatron::testing::read_file(p);
  std::vector<std::vector<int32_t>> docs;
  for (size_t offset = 0; offset < bin.size();) {
    uint32_t n;
    EXPECT_LE(offset + 4, bin.size());
    std::memcpy(&n, bin.data() + offset, 4);
    offset += 4;
    EXPECT_LE(offset + 4 * size_t(n), bin.size()) << "truncated id file " << p;
    std::vector<int32_t> ids(n);
    std::memcpy(ids.data(), bin.data() + offset, 4 * size_t(n));
    offset += 4 * size_t(n);
    docs.push_back(std::move(ids));
  }
  return docs;
}

// "" when equal, else where they part with a few ids of context.
inline std::string first_difference(const std::vector<int32_t>& ours, const std::vector<int32_t>& ref) {
  size_t k = 0;
  while (k < ours.size() && k < ref.size() && ours[k] == ref[k]) ++k;
  if (k == ours.size() && k == ref.size()) return "";
  auto show = [&](const std::vector<int32_t>& v) {
    std::string s;
    for (size_t j = k >= 3 ? k - 3 : 0; j < std::min(v.size(), k + 5); ++j)
      s += (j == k ? "[" : "") + std::to_string(v[j]) + (j == k ? "] " : " ");
    return s;
  };
  return "lengths " + std::to_string(ours.size()) + " vs " + std::to_string(ref.size()) +
         ", first difference at " + std::to_string(k) + ": ours " + show(ours) + "| reference " +
         show(ref);
}

// Runs a reference command; an empty string when it succeeded, else its output.
inline std::string run_reference(const std::string& command) {
  auto r = megatron::testing::run_command(command);
  return r.exit_code == 0 ? "" : "reference failed (" + command + "):\n" + r.output;
}

}  // namespace megatron::data::parity
