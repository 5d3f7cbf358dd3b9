// See atomic_file.h.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace megatron {

namespace fs = std::filesystem;

void set_mode(const fs::path& p, unsigned mode) {
  MG_REQUIRE(::chmod(p.c_str(), mode_t(mode)) == 0, "cannot set permissions of ", p.string(), ": ",
             std::strerror(errno));
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  MG_REQUIRE(fd >= 0, "cannot open ", p.string(), ": ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  MG_REQUIRE(ok || directory, "fsync failed: ", p.string(), " (disk full?)");
}

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write,
                           const AtomicWrite& options) {
  const fs::path tmp =
      path.string() + ".tmp" + (options.per_process_tmp ? std::to_string(::getpid()) : "");
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      MG_REQUIRE(out.good(), "cannot write ", tmp.string(), ": ", std::strerror(errno), " (",
                 options.hint, ")");
      write(out);
      out.flush();
      MG_REQUIRE(out.good(), "writing ", tmp.string(), " failed (disk full?)");
    }
    if (options.durable) fsync_path(tmp, false);
    if (options.mode >= 0) set_mode(tmp, unsigned(options.mode));
    std::error_code ec;
    fs::rename(tmp, path, ec);
    MG_REQUIRE(!ec, "cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

void write_file_atomically(const fs::path& path, std::string_view bytes, const AtomicWrite& options) {
  write_file_atomically(
      path, [&](std::ostream& out) { out.write(bytes.data(), std::streamsize(bytes.size())); },
      options);
}

}  // namespace megatron
