// What a failed save leaves behind, removed; see checkpoint_files.h.
#include <iomanip>

#include "core/error.h"
#include "training/checkpoint_files.h"

namespace megatron::training::detail {

namespace fs = std::filesystem;

namespace {

// 512 bytes, 16.4 kB, 1.2 MB, 3.4 GB.
std::string human_bytes(uint64_t bytes) {
  if (bytes < 1000) return str(bytes, " bytes");
  const char* unit[] = {"kB", "MB", "GB", "TB"};
  double v = double(bytes) / 1000;
  int u = 0;
  for (; v >= 1000 && u < 3; ++u) v /= 1000;
  return str(std::fixed, std::setprecision(1), v, " ", unit[u]);
}

}  // namespace

// The bytes of this rank's tensor files (headers aside): what its part of a save needs free.
uint64_t rank_save_bytes(const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                         const CheckpointRank& rank) {
  uint64_t n = 0;
  const auto add = [&](const Tensor& t) { n += t.defined() ? t.nbytes() : 0; };
  if (rank.edp_rank == 0)
    for (const model::Parameter* p : params)
      if (!p->shared) add(p->value);
  if (optimizer != nullptr) {
    if (const auto shard = optimizer->shard()) {
      add(shard->main), add(shard->exp_avg), add(shard->exp_avg_sq);
    } else if (rank.edp_rank == 0) {
      for (const optim::StatePiece& p : optimizer->state_pieces())
        add(p.main), add(p.exp_avg), add(p.exp_avg_sq);
    }
  }
  return n;
}

// After a failed save (a full disk, a write error): removes what it left, its temporary folder
// and the tracker's temporary file (they are this save's own), and says what was removed, what
// the save needs and what the disk has.
std::string remove_partial_save(const fs::path& save_dir, const fs::path& tmp_dir,
                                uint64_t needed) {
  std::error_code ec;
  uint64_t partial = 0, files = 0;
  for (auto it = fs::recursive_directory_iterator(tmp_dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) partial += it->file_size(ec), ++files;
  std::string note;
  if (fs::remove_all(tmp_dir, ec) > 0 && !ec)
    note = str("removed the partial save ", tmp_dir.string(), " (", files, " files, ",
               human_bytes(partial), ")");
  else if (ec)
    note = str("could not remove the partial save ", tmp_dir.string(), " (", ec.message(),
               "): remove it by hand");
  const fs::path tracker_tmp = save_dir / (std::string(kTrackerFile) + ".tmp");
  if (fs::remove(tracker_tmp, ec) && !ec)
    note += str(note.empty() ? "" : "; ", "removed ", tracker_tmp.string());
  const fs::space_info space = fs::space(save_dir, ec);
  note += str(note.empty() ? "" : "; ", "this rank's part of the save needs about ",
              human_bytes(needed), ec ? std::string() : str(" and ", save_dir.string(), " has ",
                                                           human_bytes(space.available), " free"));
  return note;
}

}  // namespace megatron::training::detail
