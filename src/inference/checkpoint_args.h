// The arguments a checkpoint was trained with, for --use-checkpoint-args: the "args" object of
// DIR/iter_NNNNNNN/metadata.json (or DIR/release/metadata.json), for the iteration that
// latest_checkpointed_iteration.txt or --ckpt-step names; for Megatron-LM's own files
// (mp_rank_*/model_optim_rng.pt) the "args" Namespace of the first rank's file, mapped onto our
// argument set (training/torch_checkpoint.h). Keys are looked up at the top level of
// "args" and then in its "model" object, so both a flat {"num_layers": 2, ...} and a nested
// {"model": {"num_layers": 2, ...}, ...} argument set are understood; a dotted key
// ("tokenizer.type") names a field of a nested object. A JSON null counts as absent.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace megatron::inference {

class CheckpointArgs {
 public:
  // Throws megatron::Error naming the folder or file when there is no checkpoint, no
  // metadata.json, or no "args" object in it.
  static CheckpointArgs read(const std::filesystem::path& load_dir,
                             std::optional<int64_t> step = std::nullopt);
  // As read, but nullopt when the checkpoint folder has no metadata.json or it has no "args"
  // (a missing checkpoint, or a malformed metadata.json, is still an error).
  static std::optional<CheckpointArgs> read_if_present(const std::filesystem::path& load_dir,
                                                       std::optional<int64_t> step = std::nullopt);
  // For tests and other sources: an argument object and the file it came from.
  CheckpointArgs(nlohmann::json args, std::filesystem::path file);

  // The value under `key`, or nullopt when absent (or null). A value of another type is a
  // megatron::Error naming the key and the file.
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_double(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;

  const std::filesystem::path& file() const { return file_; }
  const nlohmann::json& args() const { return args_; }

 private:
  const nlohmann::json* find(const std::string& key) const;

  nlohmann::json args_;
  std::filesystem::path file_;
};

}  // namespace megatron::inference
