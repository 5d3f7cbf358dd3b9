// Internal to preprocess-data: the record batches its reader thread hands to the tokenizing
// workers, and the Parquet reader that fills them (preprocess_parquet.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace megatron::data {

// One input record (a JSON line, a text line, a paragraph or a Parquet row) in Batch::data.
struct Record {
  size_t begin, end;     // in Batch::data
  int64_t line;          // 1-based line number of its first line (Parquet: row number)
  uint64_t file_offset;  // byte offset of its first byte in the input file (Parquet: 0)
  uint32_t file = 0;     // index into the input file list
};

struct Batch {
  uint64_t seq = 0;
  std::string data;
  std::vector<Record> records;
  uint64_t input_bytes = 0;  // bytes of the file this batch covers (records + separators)
  // Parquet rows: for each record, one entry per column: the end of that column's value
  // (relative to Record::begin) and whether it is null.
  std::vector<uint32_t> field_ends;
  std::vector<uint8_t> field_null;
};

// Reads the `columns` of every row of `files` in order, in batches of about `batch_bytes` or
// `batch_records`, calling push(batch) for each (push returns false to stop early; stop() is
// polled between row groups). input_bytes of the batches add up to the files' sizes.
void read_parquet_batches(const std::vector<std::string>& files,
                          const std::vector<std::string>& columns, size_t batch_bytes,
                          size_t batch_records, const std::function<bool(Batch&)>& push,
                          const std::function<bool()>& stop);

}  // namespace megatron::data
