// libFuzzer target: the Hugging Face folder importer (read_hf_checkpoint, src/training/
// hf_checkpoint.h) on a folder written to /dev/shm (or $FUZZ_TMPDIR). The input is a 2-byte length
// and config.json, a 2-byte length and model.safetensors.index.json (length 0: no index), then the
// safetensors bytes, written as model.safetensors and as model-00001-of-00002.safetensors. An
// import gives floating-point weights of the shapes its config implies and settings the model
// accepts; anything else is a megatron::Error. No size in config.json or a header may allocate
// more than the file backs (libFuzzer's -rss_limit_mb).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fuzz_scratch.h"
#include "training/hf_checkpoint.h"

namespace {

namespace fs = std::filesystem;

const fs::path& folder() {
  static const fs::path p = [] {
    const fs::path f = fuzz_scratch_path("hf_folder");
    fs::create_directories(f);
    return f;
  }();
  return p;
}

void write(const fs::path& p, const uint8_t* data, size_t n) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n));
}

size_t part(const uint8_t*& p, const uint8_t* end) {
  if (end - p < 2) return 0;
  const size_t n = std::min<size_t>(size_t(end - p - 2), size_t(p[0]) | size_t(p[1]) << 8);
  p += 2;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  const size_t config = part(p, end);
  write(folder() / "config.json", p, config);
  p += config;
  const size_t index = part(p, end);
  std::error_code ec;
  if (index > 0) write(folder() / "model.safetensors.index.json", p, index);
  else fs::remove(folder() / "model.safetensors.index.json", ec);
  p += index;
  write(folder() / "model.safetensors", p, size_t(end - p));
  write(folder() / "model-00001-of-00002.safetensors", p, size_t(end - p));
  try {
    const auto imported = megatron::training::read_hf_checkpoint(folder(), 8, 1, std::nullopt);
    const auto& m = imported.args.model;
    if (m.num_layers < 1 || m.hidden_size < 1 || m.num_attention_heads < 1 ||
        !(m.layernorm_epsilon > 0) || imported.true_vocab_size < 1)
      std::abort();
    for (const auto& [name, t] : imported.model) {
      const auto d = t.dtype();
      if (d != megatron::DType::F32 && d != megatron::DType::BF16 && d != megatron::DType::F16)
        std::abort();
      if (t.nbytes() > 2 * size) std::abort();  // backed by the file (bf16 may widen to fp32)
    }
  } catch (const megatron::Error&) {
  }
  return 0;
}
