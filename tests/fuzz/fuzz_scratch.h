// A scratch file path for fuzz targets whose code under test reads files: in /dev/shm (or
// $FUZZ_TMPDIR), one per process and name, so parallel fuzzing jobs do not share it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

inline std::string fuzz_scratch_path(const std::string& name) {
  const char* dir = std::getenv("FUZZ_TMPDIR");
  return std::string(dir ? dir : "/dev/shm") + "/fuzz_" + std::to_string(::getpid()) + "_" + name;
}
