// PyTorch's serialized files (torch.save / torch.load) without Python: the zip format of
// PyTorch >= 1.6 read and written, the legacy format (PyTorch 0.4 - 1.5: consecutive pickles and
// raw storages) read.
//
// Zip format: ARCHIVE/data.pkl (the object, pickle protocol 2, core/pickle.h), ARCHIVE/data/<key>
// (one record per storage: its elements, little-endian), ARCHIVE/version ("3"), ARCHIVE/byteorder
// ("little"); ARCHIVE is the file's stem. Tensors in the pickle refer to storages by key
// (persistent ids) and carry their offset, sizes and strides.
// Legacy format: pickles of the magic number 0x1950a86a20f9469cfc6c, the protocol version 1001
// and a system-info dict, then the object, then the list of storage keys, then for each key its
// element count (int64) and elements.
//
// Opening reads the pickle and checks that every storage it names is present with its size;
// each storage's CRC-32 is checked when a tensor of it is first read. Every tensor is
// bounds-checked against its storage (offset + extent within the storage's elements, no
// overflow) before it is copied out; every error names the file.
#pragma once

#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/pickle.h"
#include "core/tensor.h"
#include "core/zip_archive.h"

namespace megatron {

class TorchFile {
 public:
  // Reads either format; an Error names the file when it is missing, truncated, corrupted, not a
  // PyTorch file, or refers to anything but the globals the restricted unpickler knows.
  static TorchFile open(const std::filesystem::path& file);
  // The same from bytes in memory (not copied: they must outlive the TorchFile).
  static TorchFile from_memory(std::span<const uint8_t> bytes, const std::string& label);

  const pickle::Value& root() const { return *doc_.root; }
  // A contiguous CPU tensor with the contents of a Tensor value of this file.
  Tensor tensor(const pickle::Value& v) const;
  const std::string& label() const { return label_; }

 private:
  void open_zip();
  void open_legacy();
  // A storage's bytes (CRC-32 checked once when `verify`; without it only its presence and size
  // are checked and the span is empty).
  std::span<const uint8_t> storage_bytes(const pickle::Value& storage, bool verify) const;

  std::string label_;
  std::span<const uint8_t> bytes_;
  std::shared_ptr<ZipReader> zip_;
  std::string prefix_;  // "ARCHIVE/"
  pickle::Document doc_;
  std::map<std::string, std::span<const uint8_t>> legacy_storages_;
  mutable std::map<std::string, std::span<const uint8_t>> checked_;  // CRC-checked records
  std::shared_ptr<const void> keep_alive_;
};

// Writes `root` as torch.save does (zip format, archive name `archive_name`), to `file` directly:
// callers write to a temporary name and rename. Tensors must be CPU tensors.
void write_torch_file(const std::filesystem::path& file, const pickle::Value& root,
                      const std::string& archive_name);

}  // namespace megatron
