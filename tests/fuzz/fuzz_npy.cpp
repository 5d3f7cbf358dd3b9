// libFuzzer target: the .npy reader of the dataset index caches (src/data/npy.h). Any bytes must
// give an array whose element count matches its shape and the data, or a megatron::Error; never
// another exception, an overflow or an allocation the file's size does not back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto a = megatron::data::parse_npy(std::span<const uint8_t>(data, size), "fuzz.npy");
    uint64_t n = 1;
    for (int64_t d : a.shape) n *= uint64_t(d);
    if (n != a.values.size() || a.values.size() > size) std::abort();
  } catch (const megatron::Error&) {
  }
  return 0;
}
