// Whole-file writes that readers never see half done, and the file-system calls they are built
// from. Every small file this program writes for others to read (checkpoint metadata and tracker,
// the dataset index caches, .npy files, reports) goes through write_file_atomically.
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace megatron {

struct AtomicWrite {
  bool durable = false;  // fsync the file before it replaces the old one (checkpoints)
  int mode = -1;         // chmod of the new file (e.g. 0640); -1 keeps the umask's
  // The temporary is PATH.tmp<pid> (processes writing the same file do not collide), or PATH.tmp
  // where one writer owns the folder and a leftover of a killed write should be overwritten by
  // the next (checkpoints).
  bool per_process_tmp = true;
  // What the error names when the folder cannot be written (e.g. "check --output").
  std::string_view hint = "check that the folder is writable";
};

// Writes the file through `write` into a temporary beside `path`, then renames it over `path`: readers see the old file or
// the whole new one. A failure (cannot create, a short write, a full disk, the rename) removes the
// temporary and is a megatron::Error naming the file; an exception from `write` does the same and
// propagates.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(std::ostream&)>& write,
                           const AtomicWrite& options = {});
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                           const AtomicWrite& options = {});

// chmod, or an error naming the path.
void set_mode(const std::filesystem::path& p, unsigned mode);
// fsync of a file or a folder (a folder's fsync failing is tolerated: not every filesystem can).
void fsync_path(const std::filesystem::path& p, bool directory);

}  // namespace megatron
