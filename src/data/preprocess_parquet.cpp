// Parquet input for preprocess-data: rows of the selected string columns as record batches.
#include <algorithm>

#include "core/error.h"
#include "data/parquet_reader.h"
#include "data/preprocess_batch.h"

namespace megatron::data {

void read_parquet_batches(const std::vector<std::string>& files,
                          const std::vector<std::string>& columns, size_t batch_bytes,
                          size_t batch_records, const std::function<bool(Batch&)>& push,
                          const std::function<bool()>& stop) {
  Batch batch;
  for (size_t f = 0; f < files.size(); ++f) {
    ParquetFile file(files[f]);
    std::vector<size_t> index;
    for (const auto& c : columns) index.push_back(file.string_column(c, "--json-keys"));
    int64_t row = 0;
    uint64_t bytes_left = file.file_size();
    const size_t groups = file.num_row_groups();
    for (size_t g = 0; g < groups; ++g) {
      if (stop()) return;
      std::vector<StringColumn> values;
      for (size_t k : index) values.push_back(file.read(g, k));
      const int64_t rows = file.row_group_rows(g);
      // The file's bytes are spread over its row groups, for progress and ETA.
      const uint64_t group_bytes = g + 1 == groups ? bytes_left : file.file_size() / groups;
      bytes_left -= group_bytes;
      for (int64_t r = 0; r < rows; ++r) {
        Record rec{batch.data.size(), 0, ++row, 0, uint32_t(f)};
        for (const StringColumn& col : values) {
          const bool null = col.is_null(size_t(r));
          if (!null) batch.data.append(col.value(size_t(r)));
          MG_REQUIRE(batch.data.size() - rec.begin < UINT32_MAX, files[f], ": row ", row,
                     " is larger than 4 GB");
          batch.field_ends.push_back(uint32_t(batch.data.size() - rec.begin));
          batch.field_null.push_back(null);
        }
        rec.end = batch.data.size();
        batch.records.push_back(rec);
        if (r + 1 == rows) batch.input_bytes += group_bytes;
        if (batch.data.size() >= batch_bytes || batch.records.size() >= batch_records) {
          if (!push(batch)) return;
          batch = Batch();
        }
      }
      if (rows == 0) batch.input_bytes += group_bytes;
    }
    if (groups == 0) batch.input_bytes += file.file_size();
  }
  if (!batch.records.empty() || batch.input_bytes) push(batch);
}

}  // namespace megatron::data
