// Checkpoint folder and safetensors reading for inference.
#include "inference/checkpoint_weights.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron::inference {
namespace fs = std::filesystem;

namespace {

DType safetensors_dtype(const std::string& code, const fs::path& file, const std::string& name) {
  if (code == "F32") return DType::F32;
  if (code == "F16") return DType::F16;
  if (code == "BF16") return DType::BF16;
  if (code == "F64") return DType::F64;
  if (code == "I64") return DType::I64;
  if (code == "I32") return DType::I32;
  if (code == "I16") return DType::I16;
  if (code == "I8") return DType::I8;
  if (code == "U8") return DType::U8;
  MG_THROW(file.string(), ": tensor '", name, "' has unsupported dtype '", code, "'");
}

}  // namespace

std::map<std::string, Tensor> CheckpointWeights::read_safetensors(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  MG_REQUIRE(in, "cannot open ", file.string());
  const auto file_size = fs::file_size(file);
  uint8_t len_bytes[8];
  MG_REQUIRE(in.read(reinterpret_cast<char*>(len_bytes), 8) && file_size >= 8, file.string(),
             ": too short for a safetensors file");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  MG_REQUIRE(header_len <= file_size - 8 && header_len <= (uint64_t(100) << 20), file.string(),
             ": safetensors header size ", header_len, " does not fit the file (", file_size,
             " bytes)");
  std::string header(header_len, '\0');
  MG_REQUIRE(in.read(header.data(), std::streamsize(header_len)), file.string(), ": truncated header");
  nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
  MG_REQUIRE(j.is_object(), file.string(), ": the safetensors header is not a JSON object");
  const uint64_t data_start = 8 + header_len, data_size = file_size - data_start;
  std::map<std::string, Tensor> out;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    MG_REQUIRE(info.is_object() && info.contains("dtype") && info["dtype"].is_string() &&
                   info.contains("shape") && info["shape"].is_array() &&
                   info.contains("data_offsets") && info["data_offsets"].is_array() &&
                   info["data_offsets"].size() == 2,
               file.string(), ": malformed header entry for '", name, "'");
    const DType dtype = safetensors_dtype(info["dtype"].get<std::string>(), file, name);
    Shape shape;
    for (const auto& d : info["shape"]) {
      MG_REQUIRE(d.is_number_unsigned(), file.string(), ": bad shape for '", name, "'");
      shape.push_back(d.get<int64_t>());
    }
    MG_REQUIRE(info["data_offsets"][0].is_number_unsigned() && info["data_offsets"][1].is_number_unsigned(),
               file.string(), ": bad data_offsets for '", name, "'");
    const uint64_t begin = info["data_offsets"][0].get<uint64_t>();
    const uint64_t end = info["data_offsets"][1].get<uint64_t>();
    const uint64_t bytes = uint64_t(shape_numel(shape)) * dtype_size(dtype);
    MG_REQUIRE(begin <= end && end <= data_size && end - begin == bytes, file.string(), ": tensor '",
               name, "' has data_offsets [", begin, ", ", end, ") that do not match its shape ",
               shape_str(shape), " or the file size");
    Tensor t = Tensor::empty(shape, dtype);
    in.seekg(std::streamoff(data_start + begin));
    MG_REQUIRE(in.read(static_cast<char*>(t.raw_data()), std::streamsize(bytes)), file.string(),
               ": truncated data for '", name, "'");
    out.emplace(name, std::move(t));
  }
  return out;
}

CheckpointWeights CheckpointWeights::open(const fs::path& load_dir, std::optional<int64_t> step) {
  MG_REQUIRE(fs::is_directory(load_dir), "--load ", load_dir.string(), " is not a directory");
  CheckpointWeights w;
  std::string sub;
  if (step) {
    MG_REQUIRE(*step >= 0, "--ckpt-step must be >= 0");
    w.iteration_ = *step;
  } else {
    const fs::path tracker = load_dir / "latest_checkpointed_iteration.txt";
    MG_REQUIRE(fs::exists(tracker), "no checkpoint in ", load_dir.string(), ": ",
               tracker.filename().string(), " is missing (pass --ckpt-step to pick an iteration)");
    std::ifstream in(tracker);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(0, 1);
    if (text == "release") {
      sub = "release";
    } else {
      try {
        size_t used = 0;
        w.iteration_ = std::stoll(text, &used);
        MG_REQUIRE(used == text.size() && w.iteration_ >= 0, "bad");
      } catch (const std::exception&) {
        MG_THROW(tracker.string(), ": expected an iteration number or 'release', got '", text, "'");
      }
    }
  }
  if (sub.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(w.iteration_));
    sub = buf;
  }
  w.directory_ = load_dir / sub / "mp_rank_00";
  MG_REQUIRE(fs::is_directory(w.directory_), "checkpoint folder ", w.directory_.string(),
             " does not exist (only tensor- and pipeline-parallel size 1 checkpoints can be "
             "loaded for generation)");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(w.directory_))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  MG_REQUIRE(!files.empty(), "no .safetensors files in ", w.directory_.string());
  for (const auto& f : files)
    for (auto& [name, t] : read_safetensors(f)) {
      MG_REQUIRE(!w.tensors_.count(name), "tensor '", name, "' appears twice in ",
                 w.directory_.string());
      w.tensors_.emplace(name, std::move(t));
    }
  return w;
}

Tensor CheckpointWeights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? Tensor() : it->second;
}

std::vector<std::string> CheckpointWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

}  // namespace megatron::inference
