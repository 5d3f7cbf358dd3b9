// Checkpoint folder and safetensors reading for inference.
#include "inference/checkpoint_weights.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "training/checkpoint_convert.h"

namespace megatron::inference {
namespace fs = std::filesystem;

std::map<std::string, Tensor> CheckpointWeights::read_safetensors(const fs::path& file) {
  return megatron::read_safetensors(file).tensors;
}

CheckpointIteration find_checkpoint_iteration(const fs::path& load_dir,
                                              std::optional<int64_t> step) {
  MG_REQUIRE(fs::is_directory(load_dir), "--load ", load_dir.string(), " is not a directory");
  if (!step) {
    const fs::path tracker = load_dir / "latest_checkpointed_iteration.txt";
    MG_REQUIRE(fs::exists(tracker), "no checkpoint in ", load_dir.string(), ": ",
               tracker.filename().string(), " is missing (pass --ckpt-step to pick an iteration)");
    std::ifstream in(tracker);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(0, 1);
    if (text == "release") return {load_dir / "release", 0};
    try {
      size_t used = 0;
      step = std::stoll(text, &used);
      if (used != text.size() || *step < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      MG_THROW(tracker.string(), ": expected an iteration number or 'release', got '", text, "'");
    }
  }
  MG_REQUIRE(*step >= 0, "--ckpt-step must be >= 0");
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(*step));
  return {load_dir / name, *step};
}

// A training checkpoint saved under tensor or pipeline parallelism: its metadata.json says so, or
// it has a second mp_rank_* folder.
static bool is_sharded_checkpoint(const fs::path& folder) {
  if (fs::exists(folder / "mp_rank_01") || fs::exists(folder / "mp_rank_00_001")) return true;
  std::ifstream in(folder / "metadata.json");
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("parallel") || !j["parallel"].is_object())
    return false;
  const nlohmann::json& p = j["parallel"];
  auto above_one = [&](const char* key) {
    return p.contains(key) && p[key].is_number_integer() && p[key].get<int64_t>() > 1;
  };
  return above_one("tensor_model_parallel_size") || above_one("pipeline_model_parallel_size");
}

CheckpointWeights CheckpointWeights::open(const fs::path& load_dir, std::optional<int64_t> step,
                                          int64_t padded_vocab_size) {
  CheckpointWeights w;
  const CheckpointIteration it = find_checkpoint_iteration(load_dir, step);
  w.iteration_ = it.iteration;
  const fs::path folder = it.folder;
  if (fs::is_directory(folder) && is_sharded_checkpoint(folder)) {
    // Tensor/pipeline-parallel: every rank's model file (checksums verified), merged in memory.
    auto ckpt = training::find_checkpoint(load_dir, step);
    MG_REQUIRE(ckpt.has_value(), "no checkpoint in ", load_dir.string());
    log_info("merging the ", ckpt->parallel.describe(), " shards of ", ckpt->dir.string(),
             " into one model");
    w.directory_ = ckpt->dir;
    w.tensors_ = training::read_single_rank_model(*ckpt, padded_vocab_size);
    return w;
  }
  w.directory_ = folder / "mp_rank_00";
  MG_REQUIRE(fs::is_directory(w.directory_), "checkpoint folder ", w.directory_.string(),
             " does not exist");
  // The model's tensors: model.safetensors of a training checkpoint (not its optimizer files),
  // else every .safetensors file of the folder.
  std::vector<fs::path> files;
  if (fs::exists(w.directory_ / "model.safetensors")) {
    files.push_back(w.directory_ / "model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(w.directory_))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  MG_REQUIRE(!files.empty(), "no .safetensors files in ", w.directory_.string());
  for (const auto& f : files)
    for (auto& [name, t] : read_safetensors(f)) {
      MG_REQUIRE(!w.tensors_.count(name), "tensor '", name, "' appears twice in ",
                 w.directory_.string());
      w.tensors_.emplace(name, std::move(t));
    }
  return w;
}

Tensor CheckpointWeights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? Tensor() : it->second;
}

std::vector<std::string> CheckpointWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

}  // namespace megatron::inference
