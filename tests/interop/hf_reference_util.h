// Helpers of the Hugging Face tests (tests/interop/hf_checkpoint_test.cpp,
// non_finite_weights_test.cpp and tests/training/hf_export_training_test.cpp): a hand-made
// transformers GPT-2 folder, `megatron generate` on a checkpoint of the tiny
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
#include "json_lines.h"
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
  std::vector<json> out = testing::json_lines(r.output);
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

// A hand-made transformers GPT-2 folder: 1 layer, n_embd 8, 2 heads, 8 positions, 10 tokens.
inline json tiny_gpt2_config() {
  return {{"model_type", "gpt2"}, {"n_embd", 8}, {"n_layer", 1}, {"n_head", 2}, {"n_positions", 8},
          {"vocab_size", 10}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}};
}

inline std::vector<std::pair<std::string, Tensor>> tiny_gpt2_tensors() {
  std::vector<std::pair<std::string, Tensor>> t;
  auto add = [&](const std::string& n, Shape s) {
    Tensor x = Tensor::empty(s, DType::F32);
    float* p = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = float(i % 7) * 0.01f;
    t.emplace_back(n, x);
  };
  add("transformer.wte.weight", {10, 8});
  add("transformer.wpe.weight", {8, 8});
  const std::string h = "transformer.h.0.";
  for (const char* ln : {"ln_1", "ln_2"}) add(h + ln + ".weight", {8}), add(h + ln + ".bias", {8});
  add(h + "attn.c_attn.weight", {8, 24});
  add(h + "attn.c_attn.bias", {24});
  add(h + "attn.c_proj.weight", {8, 8});
  add(h + "attn.c_proj.bias", {8});
  add(h + "mlp.c_fc.weight", {8, 32});
  add(h + "mlp.c_fc.bias", {32});
  add(h + "mlp.c_proj.weight", {32, 8});
  add(h + "mlp.c_proj.bias", {8});
  add(h + "attn.bias", {1, 1, 8, 8});  // the causal-mask buffer older files carry
  add("transformer.ln_f.weight", {8});
  add("transformer.ln_f.bias", {8});
  return t;
}

inline fs::path write_folder(const fs::path& dir, const json& config,
                      const std::vector<std::pair<std::string, Tensor>>& tensors) {
  fs::create_directories(dir);
  megatron::testing::write_file(dir / "config.json", config.dump());
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  return dir;
}

}  // namespace megatron::training::hf_test
