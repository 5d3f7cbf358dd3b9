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
#include "training/checkpoint.h"
#include "training/torch_checkpoint.h"
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
    if (!fs::exists(tracker)) {
      int64_t newest = -1;
      for (const auto& e : fs::directory_iterator(load_dir)) {
        const std::string name = e.path().filename().string();
        if (name.starts_with("iter_") && name.size() > 5 && name.size() <= 23 && e.is_directory() &&
            name.find_first_not_of("0123456789", 5) == std::string::npos)
          newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
      }
      MG_THROW("no checkpoint in ", load_dir.string(), ": ", tracker.filename().string(), " is missing",
               newest >= 0 ? str("; the newest iteration folder there is ", newest,
                                 ": pass --ckpt-step ", newest, " to load it")
                           : std::string(" (pass --ckpt-step to pick an iteration)"));
    }
    MG_REQUIRE(fs::is_regular_file(tracker), tracker.string(),
               " is not a file (a folder of that name?): it must hold the iteration to load; "
               "remove it, or pass --ckpt-step N");
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
      MG_THROW(tracker.string(), ": expected an iteration number or 'release', got '",
               text.substr(0, 64), "'");
    }
  }
  MG_REQUIRE(*step >= 0, "--ckpt-step must be >= 0");
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(*step));
  const fs::path folder = load_dir / name, aside = load_dir / (std::string(".old_") + name);
  MG_REQUIRE(fs::is_directory(folder) || !fs::is_directory(aside), folder.string(),
             " does not exist; ", aside.string(), " holds it (a re-save of that iteration was "
             "interrupted): rename it back to ", name);
  MG_REQUIRE(fs::is_directory(folder), "checkpoint folder ", folder.string(),
             " does not exist (deleted or never completed; pass --ckpt-step N to pick another)");
  return {folder, *step};
}

CheckpointWeights CheckpointWeights::open(const fs::path& load_dir, std::optional<int64_t> step,
                                          int64_t padded_vocab_size) {
  CheckpointWeights w;
  const CheckpointIteration it = find_checkpoint_iteration(load_dir, step);
  w.iteration_ = it.iteration;
  const fs::path folder = it.folder;
  // metadata.json with the files' checksums: a training or converted checkpoint, under any
  // layout. metadata.json is checked against its checksum file, every model file's size and
  // SHA-256 against metadata.json, every weight must be finite; tensor- and pipeline-parallel
  // shards are merged in memory.
  const bool has_metadata = fs::exists(folder / "metadata.json");
  const bool recorded =
      has_metadata && (fs::exists(folder / "metadata.json.sha256") ||
                       training::read_checkpoint_metadata(folder).contains("files"));
  // Megatron-LM's model_optim_rng.pt files (any layout): read through the training checkpoint
  // reader (every tensor's CRC-32 checked, shards merged, weights checked finite).
  const bool torch = !has_metadata && training::is_torch_checkpoint(folder);
  if (recorded || torch) {
    auto ckpt = training::find_checkpoint(load_dir, step);
    MG_REQUIRE(ckpt.has_value(), "no checkpoint in ", load_dir.string());
    const bool sharded = ckpt->parallel.tensor_model_parallel_size > 1 ||
                         ckpt->parallel.pipeline_model_parallel_size > 1;
    if (sharded)
      log_info("merging the ", ckpt->parallel.describe(), " shards of ", ckpt->dir.string(),
               " into one model");
    w.directory_ = sharded ? ckpt->dir : ckpt->dir / "mp_rank_00";
    // Unsharded: the vocabulary table as saved, so that a tokenizer mismatch shows.
    w.tensors_ = training::read_single_rank_model(*ckpt, sharded ? padded_vocab_size : 0);
    if (torch) training::check_finite_tensors(w.tensors_, ckpt->dir.string());
    return w;
  }
  w.directory_ = folder / "mp_rank_00";
  MG_REQUIRE(fs::is_directory(w.directory_), "checkpoint folder ", w.directory_.string(),
             " does not exist");
  // Safetensors files written by another tool (no metadata.json, or one without checksums).
  // Nothing records their sizes or checksums, so only their structure and values are checked.
  log_warn(folder.string(), has_metadata ? "/metadata.json records no checksums" : " has no metadata.json",
           ": the sizes and checksums of its files cannot be verified");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(w.directory_))
    if (e.path().extension() == ".safetensors" && e.path().filename() != "optimizer.safetensors" &&
        !e.path().filename().string().starts_with("distrib_optim"))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  MG_REQUIRE(!files.empty(), "no .safetensors files in ", w.directory_.string());
  for (const auto& f : files) {
    auto tensors = read_safetensors(f);
    training::check_finite_tensors(tensors, f.string());
    for (auto& [name, t] : tensors) {
      MG_REQUIRE(!w.tensors_.count(name), "tensor '", name, "' appears twice in ",
                 w.directory_.string());
      w.tensors_.emplace(name, std::move(t));
    }
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
