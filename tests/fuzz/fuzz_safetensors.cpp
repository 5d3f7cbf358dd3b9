// libFuzzer target: the safetensors parser every checkpoint reader uses (src/core/safetensors.h).
// Any bytes give tensors that lie inside the file, or a megatron::Error naming it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto st = megatron::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz.safetensors");
    size_t total = 0;
    for (const auto& [name, t] : st.tensors) total += t.nbytes();
    if (total > size) std::abort();
  } catch (const megatron::Error&) {
  }
  return 0;
}
