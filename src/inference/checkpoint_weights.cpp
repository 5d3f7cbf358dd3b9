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
#include "kernels/ops.h"
#include "training/checkpoint.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::inference {
namespace fs = std::filesystem;

std::map<std::string, Tensor> CheckpointWeights::read_safetensors(const fs::path& file) {
  return megatron::read_safetensors(file).tensors;
}

CheckpointIteration find_checkpoint_iteration(const fs::path& load_dir,
                                              std::optional<int64_t> step) {
  MG_REQUIRE(fs::is_directory(load_dir), "--load ", load_dir.string(), " is not a directory");
  const auto where = training::locate_checkpoint(load_dir, step);  // the trainer's rules
  MG_REQUIRE(where, "no checkpoint in ", load_dir.string(), ": it holds neither ",
             training::kTrackerFile, " nor iteration folders (iter_NNNNNNN)");
  return {where->dir, where->iteration};
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
      has_metadata && !training::is_torch_dist_checkpoint(folder) && (fs::exists(folder / "metadata.json.sha256") ||
                       training::read_checkpoint_metadata(folder).contains("files"));
  // Megatron-LM's model_optim_rng.pt files (any layout): read through the training checkpoint
  // reader (every tensor's CRC-32 checked, shards merged, weights checked finite).
  const bool torch = !has_metadata && training::is_torch_checkpoint(folder);
  // Megatron-LM's default torch_dist format (metadata.json with a "sharded_backend"): global
  // tensors, any layout.
  const bool torch_dist = has_metadata && training::is_torch_dist_checkpoint(folder);
  if (recorded || torch || torch_dist) {
    auto ckpt = training::find_checkpoint(load_dir, step);
    MG_REQUIRE(ckpt.has_value(), "no checkpoint in ", load_dir.string());
    const bool sharded = ckpt->parallel.tensor_model_parallel_size > 1 ||
                         ckpt->parallel.pipeline_model_parallel_size > 1 ||
                         ckpt->parallel.expert_model_parallel_size > 1;
    if (sharded)
      log_info("merging the ", ckpt->parallel.describe(), " shards of ", ckpt->dir.string(),
               " into one model");
    w.directory_ = sharded ? ckpt->dir : ckpt->dir / "mp_rank_00";
    // Unsharded: the vocabulary table as saved, so that a tokenizer mismatch shows.
    w.tensors_ = training::read_single_rank_model(*ckpt, sharded ? padded_vocab_size : 0);
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

void load_weights_into(const model::ParameterList& params, const std::map<std::string, Tensor>& weights,
                       DType params_dtype) {
  size_t used = 0;
  for (model::Parameter* p : params) {
    auto it = weights.find(p->name);
    MG_REQUIRE(it != weights.end(), "the model weights have no tensor '", p->name,
               "', which this configuration needs; check the model flags against the checkpoint");
    MG_REQUIRE(it->second.shape() == p->value.shape(), "weight '", p->name, "' has shape ",
               shape_str(it->second.shape()), ", the configuration needs ",
               shape_str(p->value.shape()));
    const Tensor w = it->second.contiguous();
    MG_REQUIRE(ops::all_finite(w), "weight '", p->name,
               "' holds NaN or Inf values; the checkpoint is damaged");
    if (w.device() == p->value.device()) {
      ops::cast(p->value, w);
    } else {  // cast where the weight is, then one copy to the model's device
      Tensor v = Tensor::empty(w.shape(), p->value.dtype(), w.device());
      ops::cast(v, w);
      p->value.copy_(v);
    }
    ++used;
  }
  if (used != weights.size()) {
    std::string extra;
    for (const auto& [name, t] : weights)
      if (std::none_of(params.begin(), params.end(), [&](const model::Parameter* p) { return p->name == name; }))
        extra += (extra.empty() ? "" : ", ") + name;
    MG_THROW("the checkpoint has tensors this model configuration does not use (", extra,
             "); check the model flags (--normalization, --swiglu, --disable-bias-linear, "
             "--untie-embeddings-and-output-weights, --position-embedding-type, --qk-layernorm)");
  }
  // Finite weights that are not finite in the model's precision overflowed it (|w| > 65504 in
  // fp16).
  for (model::Parameter* p : params)
    MG_REQUIRE(ops::all_finite(p->value), "weight '", p->name, "' has values beyond the range of ",
               dtype_name(params_dtype), " (|w| > 65504 overflows fp16); load it with "
               "--bf16, or without --fp16");
}

}  // namespace megatron::inference
