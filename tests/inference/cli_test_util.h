// What the end-to-end tests of generate and serve share: the tiny GPT-2-style model's flags, a
// checkpoint of its random weights, and readers of the commands' output.
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "tiny_gpt.h"

namespace megatron::inference::testing {

// Architecture and tokenizer flags of the tiny GPT-2 style model (vocab 60 padded to 64).
inline const std::string kModelFlags =
    " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --max-position-embeddings 32"
    " --tokenizer-type NullTokenizer --vocab-size 60 --make-vocab-size-divisible-by 64";

// gpt2_config()'s random weights as DIR/iter_0000005 (no metadata.json).
struct Checkpoint {
  Checkpoint() : weights(random_weights(gpt2_config())) { write_checkpoint(dir.path(), weights, 5); }
  megatron::testing::TempDir dir;
  Weights weights;
};

// The output without "warning: " lines (these hand-made checkpoints have no metadata.json, so
// the loader warns that their checksums cannot be verified).
inline std::string without_warnings(const std::string& output) {
  std::istringstream lines(output);
  std::string out;
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("warning: ", 0) != 0) out += line + "\n";
  return out;
}

// The JSON lines of `generate --output-format jsonl` (other lines skipped).
inline std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::istringstream lines(output);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace megatron::inference::testing
