// Shared test helpers: temporary folders, running the CLI, paths to the source tree, the checking
// device.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace megatron::testing {

// The checking device (kernels/checked/checked_backend.h), registered on first use: tensors on
// it can be read or written only by ops and explicit copies, so a test that runs code on it
// proves that code never touches tensor memory directly.
Device checked_device();

std::filesystem::path source_dir();
std::filesystem::path cli_path();

// A fresh folder under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};
// Runs a shell command line, capturing stdout+stderr.
CommandResult run_command(const std::string& command_line);
// Runs `megatron <args>` (args already shell-quoted as needed).
CommandResult run_cli(const std::string& args);

// The message of the megatron::Error that f throws, or a line saying it threw none (so that a
// test's EXPECT on the message fails and shows why).
std::string error_of(const std::function<void()>& f);

std::string read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, const std::string& content);

}  // namespace megatron::testing
