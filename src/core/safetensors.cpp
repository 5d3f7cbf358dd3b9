// Safetensors reading (strict validation) and writing; see safetensors.h.
#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/input_bounds.h"

namespace megatron {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the Hugging Face library's limit

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

DType dtype_from_code(const std::string& code, const std::string& label, const std::string& name) {
  if (code == "F32") return DType::F32;
  if (code == "F16") return DType::F16;
  if (code == "BF16") return DType::BF16;
  if (code == "F64") return DType::F64;
  if (code == "I64") return DType::I64;
  if (code == "I32") return DType::I32;
  if (code == "I16") return DType::I16;
  if (code == "I8") return DType::I8;
  if (code == "U16") return DType::U16;
  if (code == "U8" || code == "BOOL") return DType::U8;
  MG_THROW(label, ": tensor '", name, "' has unsupported dtype '", code, "'");
}

uint64_t read_header_length(const uint8_t* p) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  return n;
}

void check_header_length(uint64_t header_len, uint64_t file_size, const std::string& label) {
  MG_REQUIRE(file_size >= 8, label, ": ", file_size,
             " bytes is too short for a safetensors file (truncated?)");
  MG_REQUIRE(header_len <= file_size - 8, label, ": the header length field says ", header_len,
             " bytes but the file has only ", file_size - 8,
             " bytes after it (truncated or not a safetensors file)");
  MG_REQUIRE(header_len <= kMaxHeaderBytes, label, ": header length ", header_len,
             " exceeds the ", kMaxHeaderBytes, "-byte limit (not a safetensors file?)");
  MG_REQUIRE(header_len >= 2, label, ": header length ", header_len, " is too small");
}

// Parses and validates the JSON header against a data region of `data_size` bytes.
Header parse_header(std::string_view text, uint64_t data_size, const std::string& label) {
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  const nlohmann::json j = nlohmann::json::parse(text, on_event, /*allow_exceptions=*/false);
  MG_REQUIRE(!j.is_discarded(), label, ": the safetensors header is not valid JSON (corrupted file?)");
  MG_REQUIRE(j.is_object(), label, ": the safetensors header is not a JSON object");
  MG_REQUIRE(duplicate.empty(), label, ": tensor '", duplicate, "' appears twice in the header");
  Header h;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      MG_REQUIRE(info.is_object(), label, ": __metadata__ must be an object of strings");
      for (const auto& [k, v] : info.items()) {
        MG_REQUIRE(v.is_string(), label, ": __metadata__ value for '", k, "' is not a string");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    MG_REQUIRE(info.is_object() && info.contains("dtype") && info["dtype"].is_string() &&
                   info.contains("shape") && info["shape"].is_array() &&
                   info.contains("data_offsets") && info["data_offsets"].is_array() &&
                   info["data_offsets"].size() == 2,
               label, ": malformed header entry for tensor '", name,
               "' (needs dtype, shape and data_offsets [begin, end])");
    Entry e;
    e.name = name;
    e.dtype = dtype_from_code(info["dtype"].get<std::string>(), label, name);
    uint64_t bytes = dtype_size(e.dtype);
    for (const auto& d : info["shape"]) {
      MG_REQUIRE(d.is_number_unsigned(), label, ": tensor '", name,
                 "' has a shape entry that is not a non-negative integer: ", d.dump());
      const uint64_t dim = d.get<uint64_t>();
      MG_REQUIRE(dim <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(bytes, dim, &bytes), label,
                 ": tensor '", name, "' has an impossibly large shape");
      e.shape.push_back(int64_t(dim));
    }
    uint64_t checked = 0;  // also the strides of a shape with a zero size
    MG_REQUIRE(checked_shape_bytes(e.shape, dtype_size(e.dtype), &checked), label, ": tensor '",
               name, "' has an impossibly large shape ", shape_str(e.shape));
    const auto& off = info["data_offsets"];
    MG_REQUIRE(off[0].is_number_unsigned() && off[1].is_number_unsigned(), label, ": tensor '",
               name, "' has data_offsets that are not non-negative integers: ", off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    MG_REQUIRE(e.begin <= e.end, label, ": tensor '", name, "' has data_offsets [", e.begin, ", ",
               e.end, ") with begin > end");
    MG_REQUIRE(e.end - e.begin == bytes, label, ": tensor '", name, "' (", info["dtype"].get<std::string>(),
               " ", shape_str(e.shape), ") needs ", bytes, " bytes but its data_offsets [", e.begin,
               ", ", e.end, ") span ", e.end - e.begin);
    h.entries.push_back(std::move(e));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (size_t i = 0; i < h.entries.size(); ++i) {
    const Entry& e = h.entries[i];
    MG_REQUIRE(e.begin >= cursor, label, ": tensor '", e.name, "' at bytes [", e.begin, ", ", e.end,
               ") overlaps tensor '", h.entries[i - 1].name, "' (ends at ", cursor, ")");
    MG_REQUIRE(e.begin == cursor, label, ": gap of ", e.begin - cursor, " bytes before tensor '",
               e.name, "' at data offset ", cursor, " (tensors must be contiguous)");
    MG_REQUIRE(e.end <= data_size, label, ": the file is truncated: tensor '", e.name,
               "' ends at data offset ", e.end, " but the data region has only ", data_size,
               " bytes");
    cursor = e.end;
  }
  MG_REQUIRE(cursor == data_size, label, ": ", data_size - cursor,
             " bytes after the last tensor are not described by the header");
  return h;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

const char* safetensors_dtype_code(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I16: return "I16";
    case DType::U16: return "U16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  MG_CHECK(false, "unknown dtype");
}

SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes,
                                      const std::string& label) try {
  const uint64_t header_len = bytes.size() >= 8 ? read_header_length(bytes.data()) : 0;
  check_header_length(header_len, bytes.size(), label);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, header_len);
  const uint64_t data_start = 8 + header_len;
  Header h = parse_header(text, bytes.size() - data_start, label);
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), bytes.data() + data_start + e.begin, e.end - e.begin);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
} MG_CATCH_OUT_OF_MEMORY(label)

SafetensorsContents read_safetensors(const fs::path& file) try {
  const std::string label = file.string();
  std::error_code ec;
  const uint64_t file_size = fs::file_size(file, ec);
  MG_REQUIRE(!ec, "cannot read ", label, ": ", ec.message());
  std::ifstream in(file, std::ios::binary);
  MG_REQUIRE(in, "cannot open ", label);
  uint8_t len_bytes[8] = {};
  if (file_size >= 8) MG_REQUIRE(in.read(reinterpret_cast<char*>(len_bytes), 8), "cannot read ", label);
  const uint64_t header_len = read_header_length(len_bytes);
  check_header_length(header_len, file_size, label);
  std::string text(header_len, '\0');
  MG_REQUIRE(in.read(text.data(), std::streamsize(header_len)), label, ": cannot read the header");
  const uint64_t data_start = 8 + header_len;
  Header h = parse_header(text, file_size - data_start, label);
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {  // sorted by offset: one sequential pass
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin)
      MG_REQUIRE(in.read(static_cast<char*>(t.raw_data()), std::streamsize(e.end - e.begin)), label,
                 ": cannot read the data of tensor '", e.name, "' (file changed while reading?)");
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
} MG_CATCH_OUT_OF_MEMORY(file.string())

void write_safetensors(const fs::path& file, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> data;
  data.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    MG_CHECK(name != "__metadata__" && !header.contains(name), "safetensors: bad or duplicate name '",
             name, "'");
    MG_CHECK(tensor.defined(), "safetensors: tensor '", name, "' is undefined");
    // A tensor on another device is written from a host copy (an explicit copy).
    data.push_back(tensor.device().is_cpu() ? tensor.contiguous() : tensor.to(Device::cpu()));
    nlohmann::ordered_json e;
    e["dtype"] = safetensors_dtype_code(tensor.dtype());
    e["shape"] = tensor.shape();
    e["data_offsets"] = {offset, offset + tensor.nbytes()};
    header[name] = std::move(e);
    offset += tensor.nbytes();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  const std::string label = file.string();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MG_REQUIRE(fd >= 0, "cannot create ", label, ": ", errno_text());
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string why = errno_text();
        ::close(fd);
        MG_THROW("write failed: ", label, ": ", why, " (disk full?)");
      }
      c += w;
      n -= size_t(w);
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(h.size()) >> (8 * i));
  write_all(len, 8);
  write_all(h.data(), h.size());
  for (const Tensor& t : data) write_all(t.raw_data(), t.nbytes());
  const bool synced = ::fsync(fd) == 0;
  const std::string why = synced ? "" : errno_text();
  MG_REQUIRE(::close(fd) == 0 && synced, "write failed: ", label, ": ", why);
}

}  // namespace megatron
