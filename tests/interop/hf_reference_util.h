// Helpers of the Hugging Face export tests (tests/interop/hf_checkpoint_test.cpp and
// tests/training/hf_export_training_test.cpp): `megatron generate` on a checkpoint of the tiny
// NullTokenizer GPT (vocabulary 64), the independent PyTorch reader's log-probs of the same
// sequences from exported folders (tests/interop/hf_reference.py), and their comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "test_util.h"

namespace megatron::training::hf_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Runs tests/interop/hf_reference.py with `args`; its output (stdout and stderr).
inline std::string python(const std::string& args) {
  const auto r = testing::run_command("/usr/bin/python3 " +
                                      (testing::source_dir() / "tests/interop/hf_reference.py").string() +
                                      " " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

inline const std::vector<std::string> kPrompts = {"1 2 3 4 5", "9 8 7"};

// `megatron generate` on the checkpoint: every prompt's tokens (prompt + `tokens` greedy) and
// log-probs.
inline std::vector<json> generate(const fs::path& ckpt, int tokens = 6,
                                  const std::vector<std::string>& prompts = kPrompts) {
  std::string cmd = "--log-level warn generate --load " + ckpt.string() +
                    " --use-checkpoint-args --tokenizer-type NullTokenizer --vocab-size 64"
                    " --num-tokens-to-generate " + std::to_string(tokens) +
                    " --top_k 1 --return-log-probs --output-format jsonl";
  for (const std::string& p : prompts) cmd += " --prompt '" + p + "'";
  const auto r = testing::run_cli(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("{")) out.push_back(json::parse(line));
  EXPECT_EQ(out.size(), prompts.size()) << r.output;
  return out;
}

// The reference's log-probs of the same token sequences from each exported folder (one Python
// process), and for each {fp32 folder, bf16 or fp16 folder} pair of `rounding` the number of
// tensors of the second checked to be those of the first rounded to its type.
struct Reference {
  std::map<std::string, std::vector<std::vector<double>>> logprobs;  // folder -> sequences
  std::map<std::string, int64_t> rounded;                             // low-precision folder -> n
};
inline Reference reference(const std::vector<fs::path>& folders, const std::vector<json>& gen,
                           const fs::path& tmp,
                           const std::vector<std::pair<fs::path, fs::path>>& rounding = {}) {
  json seqs = json::array();
  for (const json& g : gen) seqs.push_back(g["tokens"]);
  testing::write_file(tmp / "tokens.json", seqs.dump());
  std::string args = "logprobs " + (tmp / "tokens.json").string();
  for (const fs::path& f : folders) args += " " + f.string();
  for (const auto& [fp32, low] : rounding) args += " --rounding " + fp32.string() + " " + low.string();
  const std::string out = python(args);
  const json j = json::parse(out.substr(std::min(out.find('{'), out.size())));
  Reference r;
  for (const auto& [f, lp] : j["logprobs"].items()) r.logprobs[f] = lp.get<std::vector<std::vector<double>>>();
  if (j.contains("rounding"))
    for (const auto& [f, n] : j["rounding"].items()) r.rounded[f] = n.get<int64_t>();
  return r;
}

inline void expect_logprobs(const std::vector<json>& gen, const std::vector<std::vector<double>>& ref,
                            double tol, const std::string& what) {
  ASSERT_EQ(ref.size(), gen.size()) << what;
  for (size_t s = 0; s < gen.size(); ++s) {
    const auto ours = gen[s]["logprobs"].get<std::vector<double>>();
    ASSERT_EQ(ours.size(), ref[s].size()) << what;
    for (size_t i = 0; i < ours.size(); ++i) EXPECT_NEAR(ours[i], ref[s][i], tol) << what << " " << s << "/" << i;
  }
}

// The largest |ours - reference| over every log-prob (for the messages of loose comparisons).
inline double worst_logprob_difference(const std::vector<json>& gen, const std::vector<std::vector<double>>& ref) {
  double worst = 0;
  for (size_t s = 0; s < gen.size() && s < ref.size(); ++s) {
    const auto ours = gen[s]["logprobs"].get<std::vector<double>>();
    for (size_t i = 0; i < ours.size() && i < ref[s].size(); ++i)
      worst = std::max(worst, std::abs(ours[i] - ref[s][i]));
  }
  return worst;
}

// Every tensor of a folder's safetensors files (single or sharded).
inline std::map<std::string, Tensor> folder_tensors(const fs::path& folder) {
  std::map<std::string, Tensor> out;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().extension() == ".safetensors")
      for (auto& [n, t] : read_safetensors(e.path()).tensors) out[n] = t;
  return out;
}

}  // namespace megatron::training::hf_test
