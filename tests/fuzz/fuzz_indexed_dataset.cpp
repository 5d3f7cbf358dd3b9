// libFuzzer target: opening a Megatron indexed dataset (src/data/indexed_dataset.h). The input is
// a 2-byte .idx length, the .idx bytes, then the .bin bytes, written to files in /dev/shm (or
// $TMPDIR). Opening gives a dataset whose every sequence reads back within the .bin, or a
// megatron::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "data/indexed_dataset.h"

namespace {

std::string prefix() {
  static const std::string p = [] {
    const char* dir = std::getenv("FUZZ_TMPDIR");
    return std::string(dir ? dir : "/dev/shm") + "/fuzz_idx_" + std::to_string(::getpid());
  }();
  return p;
}

void write(const std::string& path, const uint8_t* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t idx_len = std::min<size_t>(size - 2, size_t(data[0]) | size_t(data[1]) << 8);
  write(prefix() + ".idx", data + 2, idx_len);
  write(prefix() + ".bin", data + 2 + idx_len, size - 2 - idx_len);
  try {
    megatron::data::IndexedDataset ds(prefix());
    int64_t tokens = 0;
    for (int64_t i = 0; i < ds.num_sequences(); ++i) tokens += int64_t(ds.get(i).size());
    if (tokens != ds.num_tokens()) std::abort();
    for (int64_t d = 0; d + 1 < int64_t(ds.document_indices().size()); ++d)
      if (ds.document_indices()[size_t(d)] > ds.document_indices()[size_t(d + 1)]) std::abort();
  } catch (const megatron::Error&) {
  }
  return 0;
}
