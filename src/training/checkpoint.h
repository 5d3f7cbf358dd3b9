// Checkpoint saving (Megatron layout): DIR/iter_NNNNNNN/mp_rank_00/model.safetensors holds the
// model parameters under their Megatron-Core names in the parameter dtype (F32/BF16/F16), and
// DIR/iter_NNNNNNN/metadata.json the iteration, consumed samples and arguments. The iteration
// folder is written under a temporary name and renamed when complete; the tracker file
// DIR/latest_checkpointed_iteration.txt is written last (temp file + rename). Files are 0640,
// folders 0750.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "model/parameter.h"

namespace megatron::training {

// Writes name -> tensor as one safetensors file (8-byte LE header length, JSON header with
// dtype/shape/data_offsets and __metadata__, 8-byte aligned header, then the data).
void write_safetensors(const std::filesystem::path& file, const model::ParameterList& params);

struct CheckpointInfo {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  std::string args_json = "{}";  // the run's arguments as a JSON object
};

// Saves the model under save_dir; returns the iteration folder.
std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir,
                                      const model::ParameterList& params,
                                      const CheckpointInfo& info);

}  // namespace megatron::training
