// Model weights for inference from a checkpoint folder: DIR/latest_checkpointed_iteration.txt
// names the iteration (or "release"), and DIR/iter_XXXXXXX/mp_rank_00/ holds the tensors in
// safetensors files (8-byte little-endian header size, a JSON header of
// {name: {dtype, shape, data_offsets}}, then the data); every malformed header, offset or dtype is
// a megatron::Error naming the file. A training checkpoint saved under tensor or pipeline
// parallelism (mp_rank_TT[_PPP]/ folders) is read whole, checksums verified, and its shards merged
// into the single-rank tensors in memory (training/checkpoint_convert.h), so generation needs no
// conversion first.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/parameter.h"

namespace megatron::inference {

// The iteration folder --load (and --ckpt-step) name: DIR/iter_XXXXXXX from `step`, else from
// DIR/latest_checkpointed_iteration.txt (a number, or "release" -> DIR/release, iteration 0).
// A missing folder or tracker, or a malformed tracker, is an Error naming it.
struct CheckpointIteration {
  std::filesystem::path folder;
  int64_t iteration = 0;
};
CheckpointIteration find_checkpoint_iteration(const std::filesystem::path& load_dir,
                                              std::optional<int64_t> step);

class CheckpointWeights {
 public:
  // `step` overrides the tracker file (--ckpt-step). padded_vocab_size > 0: a sharded checkpoint's
  // vocabulary table is re-padded to that many rows (the TP = 1 padding; the TP = T padding may
  // have more rows). directory() is then the iteration folder.
  static CheckpointWeights open(const std::filesystem::path& load_dir,
                                std::optional<int64_t> step = std::nullopt,
                                int64_t padded_vocab_size = 0);
  // The tensor of that name, or an undefined Tensor when the checkpoint has none.
  Tensor get(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::filesystem::path& directory() const { return directory_; }
  int64_t iteration() const { return iteration_; }

  // Parses one safetensors file into name -> tensor (copies the data).
  static std::map<std::string, Tensor> read_safetensors(const std::filesystem::path& file);

 private:
  std::filesystem::path directory_;
  int64_t iteration_ = 0;
  std::map<std::string, Tensor> tensors_;
};

// Casts each parameter's tensor of `weights` (by name) into its value. Every parameter must have
// one of its shape, finite, and within the range of params_dtype, and every tensor must be used:
// otherwise an Error names the tensor and the flags that decide it.
void load_weights_into(const model::ParameterList& params, const std::map<std::string, Tensor>& weights,
                       DType params_dtype);

}  // namespace megatron::inference
