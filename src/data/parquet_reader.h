// A Parquet reader for the string columns preprocess-data tokenizes, written from the format
// specification (Debian packages no Arrow/Parquet C++ library):
//  - the footer's FileMetaData (Thrift compact) with the schema, row groups and column chunks;
//  - top-level BYTE_ARRAY columns (strings; REQUIRED or OPTIONAL, nulls reported as such);
//  - data pages v1 and v2 and dictionary pages; PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY,
//    DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY encodings; definition levels in the RLE /
//    bit-packed hybrid;
//  - UNCOMPRESSED, SNAPPY (libsnappy), GZIP (zlib) and ZSTD (libzstd) pages.
// The file is memory-mapped. Every offset, length and count is checked against the file and the
// metadata, so a truncated or corrupted file throws megatron::Error naming the file, the row
// group and column, and what is wrong; it never crashes or reads out of bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::data {

// One column of one row group, decoded.
class StringColumn {
 public:
  size_t size() const { return null_.size(); }
  bool is_null(size_t row) const { return null_[row]; }
  std::string_view value(size_t row) const {
    return std::string_view(data_).substr(offsets_[row], offsets_[row + 1] - offsets_[row]);
  }

 private:
  friend class ParquetFile;
  std::string data_;
  std::vector<uint64_t> offsets_{0};
  std::vector<bool> null_;
};

class ParquetFile {
 public:
  // Maps the file and reads its footer; throws megatron::Error when it is not a readable Parquet
  // file (naming the path and the problem).
  explicit ParquetFile(const std::string& path);
  ~ParquetFile();
  ParquetFile(const ParquetFile&) = delete;
  ParquetFile& operator=(const ParquetFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return num_rows_; }
  size_t num_row_groups() const { return row_groups_.size(); }
  int64_t row_group_rows(size_t row_group) const;
  uint64_t file_size() const { return size_; }
  // Names of the top-level columns, in schema order.
  std::vector<std::string> column_names() const;
  // Index of a top-level string column; throws naming `flag` and the columns the file has when
  // there is no such column or it does not hold strings.
  size_t string_column(const std::string& name, const char* flag) const;
  // Decodes one column chunk.
  StringColumn read(size_t row_group, size_t column) const;

  struct Column;
  struct Chunk;

 private:
  void parse_footer();

  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int64_t num_rows_ = 0;
  std::vector<Column> columns_;                 // leaves, in column-chunk order
  std::vector<std::vector<Chunk>> row_groups_;  // [row group][leaf]
  std::vector<int64_t> row_group_rows_;
};

}  // namespace megatron::data
