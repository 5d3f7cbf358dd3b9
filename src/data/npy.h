// NumPy .npy (format version 1.0) for the dataset index caches: 1-D or 2-D little-endian int32,
// uint32, int64 or int16 arrays, C order. Writes go to a temporary file renamed into place, so a
// reader never sees a half-written cache; reads memory-map the file and validate the header and the
// size, throwing megatron::Error (naming the file) on anything malformed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::data {

// descr: "<i2", "<i4", "<u4", "<i8".
void write_npy(const std::string& path, const std::string& descr, const void* data,
               const std::vector<int64_t>& shape);
void write_npy_i64_as(const std::string& path, const std::string& descr, const std::vector<int64_t>& values,
                      const std::vector<int64_t>& shape);

struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<int64_t> values;  // converted to int64
};
// Reads and converts to int64 (the caches are read once per run).
NpyArray read_npy(const std::string& path);

}  // namespace megatron::data
