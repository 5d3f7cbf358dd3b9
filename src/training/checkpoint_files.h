// Internal to the checkpoint code (checkpoint.cpp, checkpoint_optimizer.cpp, checkpoint_convert.cpp):
// checksummed writes and verified reads of the tensor files of one checkpoint folder, and the
// durable small-file writes the atomic save is built from.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/safetensors.h"
#include "training/checkpoint.h"

namespace megatron::training::detail {

using megatron::fsync_path;  // core/atomic_file.h
using megatron::set_mode;
// Writes `text` to p.tmp (0640, fsynced) and renames it over p (write_file_atomically).
void write_text_file(const std::filesystem::path& p, const std::string& text);

// Publishes a complete, fsynced temporary folder as save_dir/name, then writes the tracker file
// (`tracker`: the iteration or "release"). An existing save_dir/name (an iteration saved again)
// is moved aside first and removed after, so a crash in between leaves one complete copy.
void publish_iteration(const std::filesystem::path& save_dir, const std::filesystem::path& tmp,
                       const std::string& name, const std::string& tracker);

// Writes `tensors` to dir/rel (mode 0640) and records {"bytes", "sha256"} under files[rel].
void write_tensor_file(const std::filesystem::path& dir, const std::string& rel,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       nlohmann::json& files, std::map<std::string, std::string> metadata = {});

// The file's tensors after checking its size and SHA-256 against metadata.json; a floating-point
// tensor holding NaN or an infinity is an error naming it (checkpoint_integrity.cpp).
SafetensorsContents read_tensor_file(const CheckpointOnDisk& ckpt, const std::string& rel);

// metadata.json of an iteration folder (`text`, a JSON object, with "metadata_checksum_file"
// added) and its checksum file metadata.json.sha256 ("<hex>  metadata.json", sha256sum's format,
// so `sha256sum -c` checks it too).
void write_metadata(const std::filesystem::path& dir, const std::string& text);
// metadata.json's text, verified against metadata.json.sha256. A missing checksum file is an
// error when metadata.json records "metadata_checksum_file" (every checkpoint of this build), a
// warning otherwise (checkpoints of older builds have none).
std::string read_metadata_text(const std::filesystem::path& dir);

// The bytes of this rank's tensor files in a save (headers aside): what its part needs free.
uint64_t rank_save_bytes(const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                         const CheckpointRank& rank);
// After a failed save (a full disk, a write error): removes what the save left, its temporary
// folder `tmp_dir` and the tracker's temporary file (they are its own), and returns a note saying
// what was removed, what the save needs (`needed` bytes) and what the disk has free.
std::string remove_partial_save(const std::filesystem::path& save_dir,
                                const std::filesystem::path& tmp_dir, uint64_t needed);

// mkdir -p, every folder it creates 0750 whatever the umask; an existing folder is left as is.
void create_private_dirs(const std::filesystem::path& p);
// .tmp_iter_* / .old_iter_* folders in a save folder: the leftovers of interrupted saves.
std::vector<std::string> leftover_folders(const std::filesystem::path& dir);
// Removes them (each named in a warning); an .old_iter_N whose iter_N is missing is the only
// complete copy of that iteration and is renamed back instead.
void clean_leftovers(const std::filesystem::path& save_dir);

// Optimizer files (checkpoint_optimizer.cpp): writes this rank's optimizer files into `dir` (the
// temporary iteration folder) and records their checksums in `files`; returns metadata.json's
// "optimizer" object.
nlohmann::json save_optimizer_files(const std::filesystem::path& dir,
                                    optim::MegatronOptimizer& optimizer,
                                    const CheckpointRank& rank, nlohmann::json& files);
std::string plain_optimizer_file(const CheckpointRank& rank);  // mp_rank_TT/optimizer.safetensors

// Expert parallelism (checkpoint_expert.cpp). The folders of TP rank x PP rank: one, or one per
// expert-parallel rank of the checkpoint (mp_rank_TT[_PPP]_EEE).
std::vector<std::string> checkpoint_rank_dirs(const CheckpointOnDisk& ckpt, int tp_rank, int pp_rank);
// A tensor of an MoE layer's experts (decoder.layers.<l>.mlp.experts.*): a rank of another
// expert-parallel size finds experts it does not hold in the files it reads.
bool is_expert_tensor_name(const std::string& name);
// `file` ("model.safetensors", "optimizer.safetensors") as `rank` reads it: from its own folder
// when the checkpoint's expert-parallel size is the rank's, else merged by name from every EP
// folder of its TP x PP rank (`resharded`: the contents then also hold experts of other ranks).
struct RankTensors {
  SafetensorsContents contents;
  bool resharded = false;
  std::string label;  // the file(s), for errors
};
RankTensors read_rank_tensors(const CheckpointOnDisk& ckpt, const CheckpointRank& rank,
                              const std::string& file);
// The distributed optimizer's shard files of rank's TP x PP rank in every EP folder, sorted; an
// error unless there is one per data-parallel rank of the save.
std::vector<std::string> distributed_optimizer_files(const CheckpointOnDisk& ckpt,
                                                     const CheckpointRank& rank);
// mp_rank_TT/distrib_optim_dp_RRR.safetensors
std::string distributed_optimizer_file(const std::string& rank_dir, int dp_rank);

}  // namespace megatron::training::detail
