// NumPy .npy (format version 1.0) for the dataset index caches: 1-D or 2-D little-endian int32,
// uint32, int64, uint64 or int16 arrays, C order. Writes go to a temporary file renamed into
// place, so a reader never sees a half-written cache; reads memory-map the file and validate the
// header and the size, throwing megatron::Error (naming the file) on anything malformed: a shape
// whose element count overflows or disagrees with the file's size is refused before anything is
// allocated.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::data {

// descr: "<i2", "<i4", "<u4", "<i8", "<u8" (uint64 values above INT64_MAX are refused on read).
void write_npy(const std::string& path, const std::string& descr, const void* data,
               const std::vector<int64_t>& shape);
void write_npy_i64_as(const std::string& path, const std::string& descr, const std::vector<int64_t>& values,
                      const std::vector<int64_t>& shape);

struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<int64_t> values;  // converted to int64
};
// The dict of a .npy header ("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }"),
// parsed without trusting it: every dimension must be a non-negative 64-bit integer, at most 8 of
// them; anything else is a megatron::Error naming `path`.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  std::string shape_text;  // as written, for messages
};
NpyHeader parse_npy_header(std::string_view header, const std::string& path);

// Reads and converts to int64 (the caches are read once per run).
NpyArray read_npy(const std::string& path);
// The same from a file's bytes; `path` names it in errors.
NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& path);

}  // namespace megatron::data
