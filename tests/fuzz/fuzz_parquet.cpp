// libFuzzer target: the Parquet reader of preprocess-data (src/data/parquet_reader.h and
// parquet_codec.h). The input is a whole file, written to /dev/shm (or $FUZZ_TMPDIR); every column
// chunk of every row group is decoded. A decoded column has the row group's rows; anything else is
// a megatron::Error. A page that declares more bytes than its data can hold must not allocate them
// (libFuzzer's -rss_limit_mb catches one that does).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fuzz_scratch.h"
#include "data/parquet_reader.h"

namespace {

const std::string& path() {
  static const std::string p = fuzz_scratch_path("input.parquet");
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(path(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    megatron::data::ParquetFile file(path());
    for (size_t g = 0; g < file.num_row_groups(); ++g)
      for (size_t k = 0; k < file.column_names().size(); ++k) {
        try {
          const auto column = file.read(g, k);
          if (int64_t(column.size()) != file.row_group_rows(g)) std::abort();
          for (size_t r = 0; r < column.size(); ++r)
            if (!column.is_null(r) && column.value(r).size() > size * 1100) std::abort();
        } catch (const megatron::Error&) {
        }
      }
  } catch (const megatron::Error&) {
  }
  return 0;
}
