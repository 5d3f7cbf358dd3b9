// Crafted .npy index caches: shapes whose element count overflows or disagrees with the file,
// dimensions that do not fit in 64 bits, and malformed dicts are megatron::Errors naming the file
// (never std::length_error, std::out_of_range or signed overflow), and a dataset whose cache holds
// such a file rebuilds it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/npy.h"
#include "test_util.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::error_of;
using megatron::testing::TempDir;

// A .npy v1.0 file with this header dict and `data_bytes` zero bytes of data.
void write_raw_npy(const fs::path& p, std::string dict, size_t data_bytes) {
  dict += std::string((64 - (10 + dict.size() + 1) % 64) % 64, ' ') + "\n";
  std::string bytes = "\x93NUMPY\x01";
  bytes.push_back('\0');
  const uint16_t hl = uint16_t(dict.size());
  bytes.append(reinterpret_cast<const char*>(&hl), 2);
  bytes += dict;
  bytes += std::string(data_bytes, '\0');
  megatron::testing::write_file(p, bytes);
}

TEST(NpyHeader, HostileShapesAreClearErrors) {
  TempDir dir;
  const fs::path p = dir / "x.npy";
  struct Case {
    std::string dict;
    size_t data_bytes;
    const char* says;
  };
  const std::vector<Case> cases = {
      // 2^61 + 1 eight-byte elements: the byte count overflows 64 bits.
      {"{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693953,), }", 16, "truncated or corrupt"},
      // The product of the dimensions overflows.
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }", 16, "more elements than fit"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999999,), }", 16, "does not fit in 64 bits"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (-1,), }", 16, "non-negative"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (1000000,), }", 16, "16 data bytes"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (2 3), }", 24, "commas"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (2,", 8, "not closed"},
      {"{'descr': '<i4', 'fortran_order': False, }", 8, "no key"},
      {"{'descr': <i4, 'fortran_order': False, 'shape': (2,), }", 8, "descr"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8, "unsupported dtype"},
      {"{'descr': '<i4', 'fortran_order': True, 'shape': (2,), }", 8, "Fortran"},
      {"{'descr': '<i4', 'fortran_order': Maybe, 'shape': (2,), }", 8, "fortran_order"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, "8 dimensions"},
  };
  for (const auto& c : cases) {
    write_raw_npy(p, c.dict, c.data_bytes);
    const std::string message = error_of([&] { read_npy(p.string()); });
    EXPECT_NE(message.find(c.says), std::string::npos) << c.dict << "\n -> " << message;
    EXPECT_NE(message.find(p.string()), std::string::npos) << message;
  }
  // A well-formed one still reads; () is a scalar of one element.
  write_raw_npy(p, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  EXPECT_EQ(read_npy(p.string()).shape, (std::vector<int64_t>{2, 3}));
  write_raw_npy(p, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", 8);
  EXPECT_EQ(read_npy(p.string()).values.size(), 1u);
}

TEST(NpyHeader, ADatasetRebuildsACacheWithAnOverflowingShape) {
  TempDir dir;
  const std::string prefix = (dir / "d").string();
  {
    IndexedDatasetBuilder b(prefix, IndexDType::U16);
    for (int d = 0; d < 30; ++d) {
      b.add_item(std::vector<int32_t>(size_t(20 + d), d));
      b.end_document();
    }
    b.finalize();
  }
  auto data = std::make_shared<const IndexedDataset>(prefix);
  GPTDatasetOptions o;
  o.seq_length = 16;
  o.data_cache_path = (dir / "cache").string();
  o.split = "1";
  GPTDataset a(data, Split::Train, {0, 30}, 20, o);
  ASSERT_FALSE(a.loaded_from_cache());
  for (const char* dict : {"{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693953,), }",
                           "{'descr': '<u4', 'fortran_order': False, 'shape': (4294967296, 4294967297), }"}) {
    write_raw_npy(a.cache_file("shuffle_index.npy"), dict, 16);
    GPTDataset b(data, Split::Train, {0, 30}, 20, o);
    EXPECT_FALSE(b.loaded_from_cache());
    EXPECT_EQ(b.indices().shuffle_index, a.indices().shuffle_index);
    GPTDataset c(data, Split::Train, {0, 30}, 20, o);  // the rebuilt cache is used again
    EXPECT_TRUE(c.loaded_from_cache());
  }
}

}  // namespace
}  // namespace megatron::data
