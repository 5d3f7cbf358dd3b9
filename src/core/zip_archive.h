// ZIP archives as PyTorch writes them (torch.save's zip format, the container of Megatron-LM's
// model_optim_rng.pt): uncompressed ("stored") entries, ZIP64 when offsets or sizes pass 4 GiB,
// entry data aligned to 64 bytes by padding in the local header's extra field.
//
// Reading validates strictly and throws megatron::Error naming the file and the entry: the end of
// central directory record found within the last 64 KiB + 22 bytes, the central directory and
// every local header inside the file, sizes and offsets (ZIP64 fields included) inside the file
// without overflow, no compressed, encrypted or split entries, unique names, and each entry's
// CRC-32 checked when its data is read. No allocation depends on an unchecked length: the entry
// table is bounded by the central directory's size and the data is viewed in place.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace megatron {

// A whole regular file mapped read-only (private). An Error names the file when it is missing,
// unreadable, not a regular file or empty (the message then ends with `when_empty`).
struct MappedFile {
  std::shared_ptr<const void> mapping;  // unmapped with the last copy
  std::span<const uint8_t> bytes;
};
MappedFile map_file(const std::filesystem::path& file, const char* when_empty);

// CRC-32 (IEEE 802.3, as ZIP uses), continuing from `crc` (0 to start).
uint32_t crc32(std::span<const uint8_t> data, uint32_t crc = 0);

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // of the entry's bytes in the archive
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

class ZipReader {
 public:
  // Maps the file read-only. An Error names the file when it is missing, unreadable or malformed.
  static ZipReader open(const std::filesystem::path& file);
  // Reads an archive already in memory (not copied: `bytes` must outlive the reader); `label`
  // names it in errors.
  static ZipReader from_memory(std::span<const uint8_t> bytes, std::string label);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;  // nullptr when absent
  // The entry's bytes, CRC-32 checked (an Error names the entry when they do not match).
  std::span<const uint8_t> read(const ZipEntry& entry) const;
  const std::string& label() const { return label_; }

 private:
  void parse();
  std::shared_ptr<const void> mapping_;  // keeps an mmap alive
  std::span<const uint8_t> bytes_;
  std::string label_;
  std::vector<ZipEntry> entries_;
};

// Writes a ZIP archive entry by entry (stored, data aligned to 64 bytes, ZIP64 where needed).
// finish() writes the central directory, flushes and fsyncs; a writer destroyed before finish()
// leaves an incomplete file (callers write to a temporary name and rename).
class ZipWriter {
 public:
  explicit ZipWriter(const std::filesystem::path& file);
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  void add(const std::string& name, std::span<const uint8_t> data);
  void finish();

 private:
  struct Written {
    std::string name;
    uint64_t header_offset, size;
    uint32_t crc;
  };
  void put(const void* p, size_t n);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  uint64_t offset_ = 0;
  std::vector<Written> written_;
  bool finished_ = false;
};

}  // namespace megatron
