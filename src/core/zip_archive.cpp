// ZIP reading and writing for PyTorch's checkpoint container; see zip_archive.h.
#include "core/zip_archive.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"

namespace megatron {

namespace {

// Slicing-by-8 tables for the reflected polynomial 0xEDB88320.
struct Crc32Tables {
  uint32_t t[8][256];
  Crc32Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

const Crc32Tables& crc_tables() {
  static const Crc32Tables tables;
  return tables;
}

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr size_t kEndSize = 22, kCentralSize = 46, kLocalSize = 30, kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint32_t k32 = 0xffffffffu;
constexpr uint64_t kAlignment = 64;  // torch aligns record data to 64 bytes

uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) { return uint32_t(le16(p)) | (uint32_t(le16(p + 2)) << 16); }
uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | (uint64_t(le32(p + 4)) << 32); }

// `n` bytes at `offset` lie inside a buffer of `size` bytes (no overflow).
bool inside(uint64_t offset, uint64_t n, uint64_t size) { return offset <= size && n <= size - offset; }

}  // namespace

uint32_t crc32(std::span<const uint8_t> data, uint32_t crc) {
  const auto& t = crc_tables().t;
  uint32_t c = ~crc;
  const uint8_t* p = data.data();
  size_t n = data.size();
  while (n >= 8) {
    const uint32_t a = c ^ le32(p), b = le32(p + 4);
    c = t[7][a & 0xff] ^ t[6][(a >> 8) & 0xff] ^ t[5][(a >> 16) & 0xff] ^ t[4][a >> 24] ^
        t[3][b & 0xff] ^ t[2][(b >> 8) & 0xff] ^ t[1][(b >> 16) & 0xff] ^ t[0][b >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

MappedFile map_file(const std::filesystem::path& file, const char* when_empty) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  MG_REQUIRE(fd >= 0, "cannot open ", file.string(), ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MG_THROW(file.string(), " is not a regular file");
  }
  const size_t size = size_t(st.st_size);
  if (size == 0) {
    ::close(fd);
    MG_THROW(file.string(), " is empty (0 bytes): ", when_empty);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MG_REQUIRE(p != MAP_FAILED, "cannot map ", file.string(), ": ", std::strerror(errno));
  MappedFile m;
  m.mapping = std::shared_ptr<const void>(p, [size](const void* q) {
    ::munmap(const_cast<void*>(q), size);
  });
  m.bytes = std::span<const uint8_t>(static_cast<const uint8_t*>(p), size);
  return m;
}

ZipReader ZipReader::open(const std::filesystem::path& file) {
  MappedFile m = map_file(file, "not a ZIP archive (truncated or never written?)");
  ZipReader z;
  z.mapping_ = std::move(m.mapping);
  z.bytes_ = m.bytes;
  z.label_ = file.string();
  z.parse();
  return z;
}

ZipReader ZipReader::from_memory(std::span<const uint8_t> bytes, std::string label) {
  ZipReader z;
  z.bytes_ = bytes;
  z.label_ = std::move(label);
  z.parse();
  return z;
}

void ZipReader::parse() {
  const uint8_t* b = bytes_.data();
  const uint64_t size = bytes_.size();
  const std::string& f = label_;
  MG_REQUIRE(size >= kEndSize, f, ": ", size, " bytes is too short for a ZIP archive (truncated?)");
  // The end of central directory record: the last one whose comment reaches the end of the file.
  uint64_t end = UINT64_MAX;
  const uint64_t lowest = size > kEndSize + 65535 ? size - kEndSize - 65535 : 0;
  for (uint64_t pos = size - kEndSize + 1; pos-- > lowest;) {
    if (le32(b + pos) == kEndSig && pos + kEndSize + le16(b + pos + 20) == size) {
      end = pos;
      break;
    }
  }
  MG_REQUIRE(end != UINT64_MAX, f, " is not a ZIP archive: no end-of-central-directory record "
             "(truncated or not a PyTorch zip checkpoint)");
  const uint8_t* e = b + end;
  MG_REQUIRE(le16(e + 4) == 0 && le16(e + 6) == 0, f, ": multi-disk ZIP archives are not supported");
  uint64_t count = le16(e + 10), cd_size = le32(e + 12), cd_offset = le32(e + 16);
  MG_REQUIRE(le16(e + 8) == le16(e + 10), f, ": inconsistent entry counts in the end record");
  if (end >= kZip64LocatorSize && le32(b + end - kZip64LocatorSize) == kZip64LocatorSig) {
    const uint8_t* loc = b + end - kZip64LocatorSize;
    const uint64_t z64 = le64(loc + 8);
    MG_REQUIRE(le32(loc + 4) == 0 && le32(loc + 16) <= 1, f,
               ": multi-disk ZIP64 archives are not supported");
    MG_REQUIRE(inside(z64, kZip64EndSize, end - kZip64LocatorSize) && le32(b + z64) == kZip64EndSig,
               f, ": the ZIP64 end record is missing or outside the file (corrupted archive)");
    const uint8_t* r = b + z64;
    MG_REQUIRE(le32(r + 16) == 0 && le32(r + 20) == 0 && le64(r + 24) == le64(r + 32), f,
               ": multi-disk ZIP64 archives are not supported");
    count = le64(r + 32);
    cd_size = le64(r + 40);
    cd_offset = le64(r + 48);
    end = z64;  // the central directory ends where the ZIP64 records begin
  }
  MG_REQUIRE(inside(cd_offset, cd_size, end), f, ": the central directory (", cd_size,
             " bytes at offset ", cd_offset, ") lies outside the file (truncated or corrupted)");
  MG_REQUIRE(count <= cd_size / kCentralSize, f, ": ", count, " entries cannot fit in a ", cd_size,
             "-byte central directory (corrupted archive)");
  entries_.reserve(size_t(count));
  std::set<std::string> names;
  uint64_t pos = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    MG_REQUIRE(inside(pos, kCentralSize, cd_end) && le32(b + pos) == kCentralSig, f,
               ": central directory entry ", i, " is malformed (corrupted archive)");
    const uint8_t* c = b + pos;
    const uint16_t flags = le16(c + 8), method = le16(c + 10);
    const uint32_t crc = le32(c + 16);
    uint64_t csize = le32(c + 20), usize = le32(c + 24), local = le32(c + 42);
    uint32_t disk = le16(c + 34);
    const uint64_t nlen = le16(c + 28), xlen = le16(c + 30), clen = le16(c + 32);
    MG_REQUIRE(inside(pos + kCentralSize, nlen + xlen + clen, cd_end), f,
               ": central directory entry ", i, " runs past the directory (corrupted archive)");
    ZipEntry entry;
    entry.name.assign(reinterpret_cast<const char*>(c + kCentralSize), size_t(nlen));
    // The ZIP64 extra field holds the fields saturated at 0xffffffff (0xffff for the disk).
    for (uint64_t x = pos + kCentralSize + nlen, xend = x + xlen; x + 4 <= xend;) {
      const uint16_t id = le16(b + x), len = le16(b + x + 2);
      MG_REQUIRE(x + 4 + len <= xend, f, ": entry '", entry.name, "' has a malformed extra field");
      if (id == 0x0001) {
        uint64_t at = x + 4;
        auto take = [&](uint64_t& v) {
          MG_REQUIRE(at + 8 <= x + 4 + len, f, ": entry '", entry.name, "' has a short ZIP64 field");
          v = le64(b + at);
          at += 8;
        };
        if (usize == k32) take(usize);
        if (csize == k32) take(csize);
        if (local == k32) take(local);
        if (disk == 0xffff) {
          MG_REQUIRE(at + 4 <= x + 4 + len, f, ": entry '", entry.name, "' has a short ZIP64 field");
          disk = le32(b + at);
        }
      }
      x += 4 + len;
    }
    MG_REQUIRE(disk == 0, f, ": entry '", entry.name, "' is on another disk (split archives are not supported)");
    MG_REQUIRE((flags & 1) == 0, f, ": entry '", entry.name, "' is encrypted");
    MG_REQUIRE(method == 0 && csize == usize, f, ": entry '", entry.name, "' is compressed (method ",
               method, "); PyTorch checkpoints store entries uncompressed");
    MG_REQUIRE(inside(local, kLocalSize, cd_offset) && le32(b + local) == kLocalSig, f,
               ": the local header of entry '", entry.name, "' is missing (corrupted archive)");
    const uint8_t* l = b + local;
    const uint64_t lnlen = le16(l + 26), lxlen = le16(l + 28);
    MG_REQUIRE(lnlen == nlen && inside(local + kLocalSize, lnlen, cd_offset) &&
                   std::memcmp(l + kLocalSize, entry.name.data(), size_t(nlen)) == 0,
               f, ": the local header of entry '", entry.name, "' names another entry (corrupted archive)");
    MG_REQUIRE(le16(l + 8) == 0, f, ": entry '", entry.name, "' is compressed in its local header");
    entry.data_offset = local + kLocalSize + lnlen + lxlen;
    entry.size = usize;
    entry.crc32 = crc;
    MG_REQUIRE(inside(entry.data_offset, entry.size, cd_offset), f, ": the data of entry '",
               entry.name, "' (", entry.size, " bytes) runs past the end of the entries "
               "(truncated or corrupted archive)");
    MG_REQUIRE(names.insert(entry.name).second, f, ": entry '", entry.name, "' appears twice");
    entries_.push_back(std::move(entry));
    pos += kCentralSize + nlen + xlen + clen;
  }
}

const ZipEntry* ZipReader::find(const std::string& name) const {
  for (const ZipEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::span<const uint8_t> ZipReader::read(const ZipEntry& entry) const {
  MG_CHECK(inside(entry.data_offset, entry.size, bytes_.size()), "zip entry outside the archive");
  const std::span<const uint8_t> data = bytes_.subspan(size_t(entry.data_offset), size_t(entry.size));
  const uint32_t crc = crc32(data);
  MG_REQUIRE(crc == entry.crc32, label_, ": entry '", entry.name,
             "' fails its CRC-32 check (the file is corrupted): expected ", entry.crc32, ", got ", crc);
  return data;
}

// ---------------------------------------------------------------------------------------------

namespace {

struct Bytes {
  std::vector<uint8_t> v;
  void u16(uint32_t x) { v.push_back(uint8_t(x)), v.push_back(uint8_t(x >> 8)); }
  void u32(uint32_t x) { u16(x & 0xffff), u16(x >> 16); }
  void u64(uint64_t x) { u32(uint32_t(x)), u32(uint32_t(x >> 32)); }
  void raw(const std::string& s) { v.insert(v.end(), s.begin(), s.end()); }
};

constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: reproducible files

}  // namespace

ZipWriter::ZipWriter(const std::filesystem::path& file) : path_(file) {
  file_ = std::fopen(file.c_str(), "wb");
  MG_REQUIRE(file_ != nullptr, "cannot write ", file.string(), ": ", std::strerror(errno),
             " (check that the folder exists and is writable)");
}

ZipWriter::~ZipWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void ZipWriter::put(const void* p, size_t n) {
  MG_REQUIRE(n == 0 || std::fwrite(p, 1, n, file_) == n, "write failed: ", path_.string(),
             " (disk full?)");
  offset_ += n;
}

void ZipWriter::add(const std::string& name, std::span<const uint8_t> data) {
  MG_CHECK(!finished_ && name.size() < 0xffff, "ZipWriter::add");
  const uint64_t size = data.size();
  const bool zip64 = size >= k32;
  const uint32_t crc = crc32(data);
  Bytes h;
  h.u32(kLocalSig);
  h.u16(zip64 ? 45 : 20);
  h.u16(0);  // flags
  h.u16(0);  // stored
  h.u16(0);
  h.u16(kDosDate);
  h.u32(crc);
  h.u32(zip64 ? k32 : uint32_t(size));
  h.u32(zip64 ? k32 : uint32_t(size));
  h.u16(uint32_t(name.size()));
  const size_t zip64_len = zip64 ? 20 : 0;
  const uint64_t start = offset_ + kLocalSize + name.size() + zip64_len;
  uint64_t pad = (kAlignment - start % kAlignment) % kAlignment;
  if (pad < 4) pad += kAlignment;  // the padding field needs its own 4-byte header
  h.u16(uint32_t(zip64_len + pad));
  h.raw(name);
  if (zip64) {
    h.u16(0x0001), h.u16(16), h.u64(size), h.u64(size);
  }
  h.u16(0x4246);  // "FB": PyTorch's alignment padding
  h.u16(uint32_t(pad - 4));
  h.v.insert(h.v.end(), size_t(pad - 4), uint8_t('Z'));
  written_.push_back({name, offset_, size, crc});
  put(h.v.data(), h.v.size());
  put(data.data(), data.size());
}

void ZipWriter::finish() {
  MG_CHECK(!finished_, "ZipWriter::finish twice");
  const uint64_t cd_offset = offset_;
  for (const Written& w : written_) {
    const bool big_size = w.size >= k32, big_offset = w.header_offset >= k32;
    Bytes c;
    c.u32(kCentralSig);
    c.u16(big_size || big_offset ? 45 : 20);  // made by
    c.u16(big_size || big_offset ? 45 : 20);  // needed
    c.u16(0);
    c.u16(0);
    c.u16(0);
    c.u16(kDosDate);
    c.u32(w.crc);
    c.u32(big_size ? k32 : uint32_t(w.size));
    c.u32(big_size ? k32 : uint32_t(w.size));
    c.u16(uint32_t(w.name.size()));
    const uint32_t xlen = (big_size || big_offset) ? 4 + (big_size ? 16 : 0) + (big_offset ? 8 : 0) : 0;
    c.u16(xlen);
    c.u16(0);  // comment
    c.u16(0);  // disk
    c.u16(0);
    c.u32(0);
    c.u32(big_offset ? k32 : uint32_t(w.header_offset));
    c.raw(w.name);
    if (xlen > 0) {
      c.u16(0x0001);
      c.u16(xlen - 4);
      if (big_size) c.u64(w.size), c.u64(w.size);
      if (big_offset) c.u64(w.header_offset);
    }
    put(c.v.data(), c.v.size());
  }
  const uint64_t cd_size = offset_ - cd_offset, count = written_.size();
  const bool zip64 = count >= 0xffff || cd_size >= k32 || cd_offset >= k32;
  Bytes e;
  if (zip64) {
    const uint64_t z64 = offset_;
    e.u32(kZip64EndSig);
    e.u64(kZip64EndSize - 12);
    e.u16(45), e.u16(45), e.u32(0), e.u32(0);
    e.u64(count), e.u64(count), e.u64(cd_size), e.u64(cd_offset);
    e.u32(kZip64LocatorSig), e.u32(0), e.u64(z64), e.u32(1);
  }
  e.u32(kEndSig);
  e.u16(0), e.u16(0);
  e.u16(zip64 ? 0xffff : uint32_t(count));
  e.u16(zip64 ? 0xffff : uint32_t(count));
  e.u32(zip64 ? k32 : uint32_t(cd_size));
  e.u32(zip64 ? k32 : uint32_t(cd_offset));
  e.u16(0);
  put(e.v.data(), e.v.size());
  MG_REQUIRE(std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0, "write failed: ",
             path_.string(), " (disk full?)");
  const int rc = std::fclose(file_);
  file_ = nullptr;
  MG_REQUIRE(rc == 0, "write failed: ", path_.string(), " (disk full?)");
  finished_ = true;
}

}  // namespace megatron
