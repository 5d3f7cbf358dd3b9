// See npy.h. Header: "\x93NUMPY" 1 0, u16 header length, a Python dict literal padded with spaces
// and a newline so the data starts at a multiple of 64 bytes (NumPy's own alignment).
#include "data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <charconv>

#include "core/error.h"

namespace megatron::data {

static size_t descr_size(const std::string& d) {
  if (d == "<i2") return 2;
  if (d == "<i4" || d == "<u4") return 4;
  if (d == "<i8" || d == "<u8") return 8;
  return 0;
}

void write_npy(const std::string& path, const std::string& descr, const void* data,
               const std::vector<int64_t>& shape) {
  size_t elem = descr_size(descr);
  MG_CHECK(elem > 0, "unsupported npy dtype ", descr);
  std::string shp = "(";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    shp += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= shape[i];
  }
  shp += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shp + ", }";
  size_t total = 10 + header.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  header += std::string(pad, ' ') + "\n";
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MG_REQUIRE(f.good(), "cannot write ", tmp, ": ", std::strerror(errno));
    f.write("\x93NUMPY\x01\x00", 8);
    uint16_t hl = uint16_t(header.size());
    f.write(reinterpret_cast<const char*>(&hl), 2);
    f.write(header.data(), std::streamsize(header.size()));
    f.write(static_cast<const char*>(data), std::streamsize(size_t(n) * elem));
    f.flush();
    MG_REQUIRE(f.good(), "writing ", tmp, " failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    MG_THROW("cannot rename ", tmp, " to ", path, ": ", ec.message());
  }
}

void write_npy_i64_as(const std::string& path, const std::string& descr, const std::vector<int64_t>& values,
                      const std::vector<int64_t>& shape) {
  if (descr == "<i8" || descr == "<u8") return write_npy(path, descr, values.data(), shape);
  if (descr == "<i4") {
    std::vector<int32_t> v(values.begin(), values.end());
    return write_npy(path, descr, v.data(), shape);
  }
  if (descr == "<u4") {
    std::vector<uint32_t> v(values.begin(), values.end());
    return write_npy(path, descr, v.data(), shape);
  }
  MG_CHECK(descr == "<i2", "unsupported npy dtype ", descr);
  std::vector<int16_t> v(values.begin(), values.end());
  write_npy(path, descr, v.data(), shape);
}

NpyHeader parse_npy_header(std::string_view header, const std::string& path) {
  auto fail = [&](const char* what) {
    MG_THROW(path, ": malformed .npy header (", what, "): '", header.substr(0, 200),
             header.size() > 200 ? "...'" : "'");
  };
  // The value after 'key': in the dict literal.
  auto value_of = [&](std::string_view key) -> std::string_view {
    const std::string quoted = "'" + std::string(key) + "'";
    size_t k = header.find(quoted);
    if (k == std::string_view::npos) fail("no key");
    k += quoted.size();
    while (k < header.size() && header[k] == ' ') ++k;
    if (k >= header.size() || header[k] != ':') fail("no ':' after a key");
    ++k;
    while (k < header.size() && header[k] == ' ') ++k;
    return header.substr(k);
  };
  NpyHeader h;
  std::string_view d = value_of("descr");
  if (d.empty() || d[0] != '\'') fail("descr is not a string");
  const size_t d_end = d.find('\'', 1);
  if (d_end == std::string_view::npos || d_end > 8) fail("descr is not a short string");
  h.descr = std::string(d.substr(1, d_end - 1));
  if (h.descr == "|i1") h.descr = "<i1";
  const std::string_view f = value_of("fortran_order");
  if (f.starts_with("True")) h.fortran_order = true;
  else if (!f.starts_with("False")) fail("fortran_order is not True or False");
  std::string_view s = value_of("shape");
  if (s.empty() || s[0] != '(') fail("shape is not a tuple");
  const size_t s_end = s.find(')');
  if (s_end == std::string_view::npos) fail("shape tuple not closed");
  h.shape_text = std::string(s.substr(0, s_end + 1));
  s = s.substr(1, s_end - 1);
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    if (i == s.size()) break;
    int64_t dim = 0;
    const auto [ptr, ec] = std::from_chars(s.data() + i, s.data() + s.size(), dim);
    if (ec == std::errc::result_out_of_range) fail("a dimension does not fit in 64 bits");
    if (ec != std::errc() || dim < 0) fail("a dimension is not a non-negative integer");
    h.shape.push_back(dim);
    if (h.shape.size() > 8) fail("more than 8 dimensions");
    i = size_t(ptr - s.data());
    while (i < s.size() && s[i] == ' ') ++i;
    if (i < s.size() && s[i] != ',') fail("dimensions not separated by commas");
    ++i;
  }
  return h;
}

namespace {
struct Mapping {
  const uint8_t* p = nullptr;
  size_t n = 0;
  ~Mapping() {
    if (p) ::munmap(const_cast<uint8_t*>(p), n);
  }
};
}  // namespace

NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& path) {
  MG_REQUIRE(bytes.size() >= 10 && std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8) == 0, path,
             ": not a NumPy .npy v1.0 file (bad magic or truncated)");
  uint16_t hl;
  std::memcpy(&hl, bytes.data() + 8, 2);
  MG_REQUIRE(10 + size_t(hl) <= bytes.size(), path, ": truncated .npy header");
  const std::string header(reinterpret_cast<const char*>(bytes.data() + 10), hl);
  const NpyHeader h = parse_npy_header(header, path);
  NpyArray a;
  a.descr = h.descr;
  const size_t elem = descr_size(a.descr);
  MG_REQUIRE(elem > 0, path, ": unsupported dtype ", a.descr, " (expected <i2, <i4, <u4, <i8 or <u8)");
  MG_REQUIRE(!h.fortran_order, path, ": Fortran-order arrays are not supported");
  a.shape = h.shape;
  // The element count, checked against the bytes present before anything is allocated: a
  // header may claim any shape, the file's size is the truth.
  const size_t off = 10 + hl;
  const uint64_t data_bytes = bytes.size() - off;
  uint64_t n = 1;
  for (int64_t d : a.shape)
    MG_REQUIRE(!__builtin_mul_overflow(n, uint64_t(d), &n), path, ": the shape ", h.shape_text,
               " has more elements than fit in 64 bits (corrupt header)");
  uint64_t need = 0;
  MG_REQUIRE(!__builtin_mul_overflow(n, uint64_t(elem), &need) && need == data_bytes, path, ": holds ",
             data_bytes, " data bytes but its header says shape ", h.shape_text, " of ", elem,
             "-byte elements (truncated or corrupt)");
  a.values.resize(size_t(n));
  const uint8_t* p = bytes.data() + off;
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t* q = p + size_t(i) * elem;
    if (a.descr == "<i2") { int16_t v; std::memcpy(&v, q, 2); a.values[size_t(i)] = v; }
    else if (a.descr == "<i4") { int32_t v; std::memcpy(&v, q, 4); a.values[size_t(i)] = v; }
    else if (a.descr == "<u4") { uint32_t v; std::memcpy(&v, q, 4); a.values[size_t(i)] = v; }
    else if (a.descr == "<u8") {
      uint64_t v;
      std::memcpy(&v, q, 8);
      MG_REQUIRE(v <= uint64_t(INT64_MAX), path, ": value ", v, " at element ", i, " is out of range");
      a.values[size_t(i)] = int64_t(v);
    }
    else { int64_t v; std::memcpy(&v, q, 8); a.values[size_t(i)] = v; }
  }
  return a;
}

NpyArray read_npy(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MG_REQUIRE(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  Mapping m;
  m.n = stat_ok ? size_t(st.st_size) : 0;
  if (m.n > 0) {
    void* p = ::mmap(nullptr, m.n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) m.p = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  MG_REQUIRE(m.p, path, ": not a NumPy .npy v1.0 file (empty or unreadable)");
  return parse_npy(std::span<const uint8_t>(m.p, m.n), path);
}

}  // namespace megatron::data
