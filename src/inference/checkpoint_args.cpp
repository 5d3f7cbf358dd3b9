// metadata.json "args" of a checkpoint; see checkpoint_args.h.
#include "inference/checkpoint_args.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "inference/checkpoint_weights.h"
#include "training/checkpoint.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_checkpoint.h"

namespace megatron::inference {

namespace fs = std::filesystem;

CheckpointArgs::CheckpointArgs(nlohmann::json args, fs::path file)
    : args_(std::move(args)), file_(std::move(file)) {
  MG_REQUIRE(args_.is_object(), file_.string(), ": \"args\" is not a JSON object");
}

CheckpointArgs CheckpointArgs::read(const fs::path& load_dir, std::optional<int64_t> step) {
  const fs::path folder = find_checkpoint_iteration(load_dir, step).folder;
  const fs::path file = folder / "metadata.json";
  MG_REQUIRE(fs::exists(file) || training::is_torch_checkpoint(folder), "--use-checkpoint-args: ", file.string(),
             " does not exist, so the checkpoint's arguments are unknown; drop "
             "--use-checkpoint-args and pass the model flags (--num-layers, --hidden-size, ...)");
  std::optional<CheckpointArgs> args = read_if_present(load_dir, step);
  MG_REQUIRE(args, "--use-checkpoint-args: ", file.string(),
             " has no \"args\" object; pass the model flags instead");
  return *std::move(args);
}

std::optional<CheckpointArgs> CheckpointArgs::read_if_present(const fs::path& load_dir,
                                                             std::optional<int64_t> step) {
  const fs::path folder = find_checkpoint_iteration(load_dir, step).folder;
  if (training::is_torch_dist_checkpoint(folder)) {
    // Megatron-LM's torch_dist: the "args" Namespace of its common.pt, in our argument set's shape.
    training::CheckpointOnDisk ck =
        training::open_torch_dist_checkpoint(folder, folder.filename() == "release", std::nullopt);
    return CheckpointArgs(ck.state.args, folder / "common.pt");
  }
  if (training::is_torch_checkpoint(folder)) {
    // Megatron-LM's files: the "args" Namespace of the first rank's model_optim_rng.pt, in our
    // argument set's shape (torch_checkpoint.h), which has a "model" object as ours does.
    training::CheckpointOnDisk ck =
        training::open_torch_checkpoint(folder, folder.filename() == "release", std::nullopt);
    const fs::path first = fs::exists(folder / "mp_rank_00" / training::kTorchCheckpointFile)
                               ? folder / "mp_rank_00" / training::kTorchCheckpointFile
                               : folder / "mp_rank_00_000" / training::kTorchCheckpointFile;
    return CheckpointArgs(ck.state.args, first);
  }
  const fs::path file = folder / "metadata.json";
  if (!fs::exists(file)) return std::nullopt;
  // Checked against metadata.json.sha256, as every reader of the checkpoint does.
  nlohmann::json meta = training::read_checkpoint_metadata(file.parent_path());
  if (!meta.contains("args") || !meta["args"].is_object()) return std::nullopt;
  return CheckpointArgs(meta["args"], file);
}

const nlohmann::json* CheckpointArgs::find(const std::string& key) const {
  if (const size_t dot = key.find('.'); dot != std::string::npos) {  // "tokenizer.type"
    auto outer = args_.find(key.substr(0, dot));
    if (outer == args_.end() || !outer->is_object()) return nullptr;
    auto inner = outer->find(key.substr(dot + 1));
    return inner != outer->end() && !inner->is_null() ? &*inner : nullptr;
  }
  auto it = args_.find(key);
  if (it != args_.end() && !it->is_null()) return &*it;
  auto model = args_.find("model");
  if (model != args_.end() && model->is_object()) {
    auto m = model->find(key);
    if (m != model->end() && !m->is_null()) return &*m;
  }
  return nullptr;
}

std::optional<int64_t> CheckpointArgs::get_int(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  MG_REQUIRE(v->is_number_integer(), file_.string(), ": args \"", key, "\" should be an integer, got ",
             v->dump());
  return v->get<int64_t>();
}

std::optional<double> CheckpointArgs::get_double(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  MG_REQUIRE(v->is_number(), file_.string(), ": args \"", key, "\" should be a number, got ", v->dump());
  return v->get<double>();
}

std::optional<bool> CheckpointArgs::get_bool(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  MG_REQUIRE(v->is_boolean(), file_.string(), ": args \"", key, "\" should be true or false, got ",
             v->dump());
  return v->get<bool>();
}

std::optional<std::string> CheckpointArgs::get_string(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  MG_REQUIRE(v->is_string(), file_.string(), ": args \"", key, "\" should be a string, got ", v->dump());
  return v->get<std::string>();
}

}  // namespace megatron::inference
