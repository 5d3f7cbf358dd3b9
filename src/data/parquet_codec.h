// Decompression of Parquet pages (UNCOMPRESSED, SNAPPY, GZIP, ZSTD) for parquet_reader.cpp. The
// size a page declares is checked against what its codec can expand the compressed bytes to
// before anything is allocated, and output grows with the data actually decompressed, so a small
// file that declares a huge page costs nothing.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace megatron::data {

// The `expected` bytes that `in` (compressed with Parquet codec id `codec`) holds; an Error naming
// `where` when the data is damaged, decompresses to another size or the codec is unsupported.
std::string parquet_decompress(int codec, std::string_view in, size_t expected,
                               const std::string& where);

}  // namespace megatron::data
