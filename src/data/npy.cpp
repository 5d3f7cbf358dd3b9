// See npy.h. Header: "\x93NUMPY" 1 0, u16 header length, a Python dict literal padded with spaces
// and a newline so the data starts at a multiple of 64 bytes (NumPy's own alignment).
#include "data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace megatron::data {

static size_t descr_size(const std::string& d) {
  if (d == "<i2") return 2;
  if (d == "<i4" || d == "<u4") return 4;
  if (d == "<i8") return 8;
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
  if (descr == "<i8") return write_npy(path, descr, values.data(), shape);
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

namespace {
struct Mapping {
  const uint8_t* p = nullptr;
  size_t n = 0;
  ~Mapping() {
    if (p) ::munmap(const_cast<uint8_t*>(p), n);
  }
};
}  // namespace

NpyArray read_npy(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  MG_REQUIRE(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  Mapping m;
  m.n = size_t(st.st_size);
  if (m.n > 0) {
    void* p = ::mmap(nullptr, m.n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) m.p = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  MG_REQUIRE(m.p && m.n >= 10 && std::memcmp(m.p, "\x93NUMPY\x01\x00", 8) == 0, path,
             ": not a NumPy .npy v1.0 file (bad magic or truncated)");
  uint16_t hl;
  std::memcpy(&hl, m.p + 8, 2);
  MG_REQUIRE(10 + size_t(hl) <= m.n, path, ": truncated .npy header");
  std::string header(reinterpret_cast<const char*>(m.p + 10), hl);
  std::smatch d, s, f;
  MG_REQUIRE(std::regex_search(header, d, std::regex("'descr':\\s*'([<|>]?[a-z][0-9])'")) &&
                 std::regex_search(header, f, std::regex("'fortran_order':\\s*(True|False)")) &&
                 std::regex_search(header, s, std::regex("'shape':\\s*\\(([0-9, ]*)\\)")),
             path, ": malformed .npy header '", header, "'");
  NpyArray a;
  a.descr = d[1].str();
  if (a.descr == "|i1") a.descr = "<i1";
  size_t elem = descr_size(a.descr);
  MG_REQUIRE(elem > 0, path, ": unsupported dtype ", a.descr, " (expected <i2, <i4, <u4 or <i8)");
  MG_REQUIRE(f[1].str() == "False", path, ": Fortran-order arrays are not supported");
  std::string shp = s[1].str();
  int64_t n = 1;
  const std::regex digits("[0-9]+");
  for (auto it = std::sregex_iterator(shp.begin(), shp.end(), digits); it != std::sregex_iterator(); ++it) {
    a.shape.push_back(std::stoll(it->str()));
    n *= a.shape.back();
  }
  size_t off = 10 + hl;
  MG_REQUIRE(m.n - off == size_t(n) * elem, path, ": holds ", m.n - off, " data bytes but its header says ", n,
             " elements of ", elem, " bytes (truncated or corrupt)");
  a.values.resize(size_t(n));
  const uint8_t* p = m.p + off;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* q = p + size_t(i) * elem;
    if (a.descr == "<i2") { int16_t v; std::memcpy(&v, q, 2); a.values[size_t(i)] = v; }
    else if (a.descr == "<i4") { int32_t v; std::memcpy(&v, q, 4); a.values[size_t(i)] = v; }
    else if (a.descr == "<u4") { uint32_t v; std::memcpy(&v, q, 4); a.values[size_t(i)] = v; }
    else { int64_t v; std::memcpy(&v, q, 8); a.values[size_t(i)] = v; }
  }
  return a;
}

}  // namespace megatron::data
