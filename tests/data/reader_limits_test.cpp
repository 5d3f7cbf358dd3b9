// Sizes a data file declares are checked against what it holds before memory is spent on them:
//   - a Parquet GZIP page that declares 2^31 - 1 uncompressed bytes for a 123 KB page is refused
//     before anything is allocated (it once zero-filled 2.2 GB), and a declared size within
//     deflate's ratio costs only the data actually decompressed; the same for SNAPPY and ZSTD;
//   - inspect-data --entropy on a negative token id is an error naming the sequence and position
//     (it printed vector::_M_fill_insert), and on an id of 2^31 - 1 counts it without 16 GB.
#include <gtest/gtest.h>
#include <snappy.h>
#include <sys/resource.h>
#include <zlib.h>
#include <zstd.h>

#include <random>

#include "data/indexed_dataset.h"
#include "data/parquet_codec.h"
#include "test_util.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;
using megatron::testing::error_of;
using megatron::testing::run_cli;
using megatron::testing::TempDir;

constexpr int kSnappy = 1, kGzip = 2, kZstd = 6;  // Parquet's codec ids

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

std::string random_bytes(size_t n) {
  std::mt19937 rng(5);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

std::string gzip(const std::string& in) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // gzip header
  std::string out(deflateBound(&z, uLong(in.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(ReaderLimits, ParquetPagesDeclaringMoreThanTheirDataAllocateNothing) {
  const std::string text = random_bytes(123 << 10);  // incompressible: the page is ~123 KB
  const std::string gz = gzip(text);
  ASSERT_GT(gz.size(), size_t(120 << 10));
  EXPECT_EQ(parquet_decompress(kGzip, gz, text.size(), "page"), text);
  const int64_t peak_before = peak_rss_bytes();
  // 2^31 - 1 bytes from 123 KB: beyond deflate's 1032:1, refused before any allocation.
  std::string e = error_of([&] { parquet_decompress(kGzip, gz, (size_t(1) << 31) - 1, "f.parquet: page 0"); });
  EXPECT_NE(e.find("f.parquet: page 0: the page says its"), std::string::npos) << e;
  EXPECT_NE(e.find("more than GZIP can expand them to (1032x)"), std::string::npos) << e;
  // 100 MB: within the ratio, so decompressed for real; the output grows with the data (123 KB)
  // and the sizes disagree.
  e = error_of([&] { parquet_decompress(kGzip, gz, 100u << 20, "page"); });
  EXPECT_NE(e.find("GZIP data does not decompress to the page's 104857600 bytes"), std::string::npos) << e;
  const std::string sn = [&] {
    std::string out;
    snappy::Compress(text.data(), text.size(), &out);
    return out;
  }();
  e = error_of([&] { parquet_decompress(kSnappy, sn, (size_t(1) << 31) - 1, "page"); });
  EXPECT_NE(e.find("more than SNAPPY can expand them to (22x)"), std::string::npos) << e;
  EXPECT_EQ(parquet_decompress(kSnappy, sn, text.size(), "page"), text);
  std::string zs(ZSTD_compressBound(text.size()), '\0');
  zs.resize(ZSTD_compress(zs.data(), zs.size(), text.data(), text.size(), 3));
  EXPECT_EQ(parquet_decompress(kZstd, zs, text.size(), "page"), text);
  e = error_of([&] { parquet_decompress(kZstd, zs, (size_t(1) << 31) - 1, "page"); });
  EXPECT_NE(e.find("ZSTD data declares 125952 bytes but the page says 2147483647"), std::string::npos) << e;
  // A zstd frame without a declared size decompresses as far as its data goes.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::string zu(ZSTD_compressBound(text.size()), '\0');
  zu.resize(ZSTD_compress2(cctx, zu.data(), zu.size(), text.data(), text.size()));
  ZSTD_freeCCtx(cctx);
  EXPECT_EQ(parquet_decompress(kZstd, zu, text.size(), "page"), text);
  e = error_of([&] { parquet_decompress(kZstd, zu, (size_t(1) << 31) - 1, "page"); });
  EXPECT_NE(e.find("ZSTD data does not decompress to the page's 2147483647 bytes"), std::string::npos) << e;
  // Nothing near the declared sizes was ever allocated.
  EXPECT_LT(peak_rss_bytes() - peak_before, int64_t(64) << 20);
}

TEST(ReaderLimits, InspectDataEntropyOnOutOfRangeIds) {
  TempDir dir;
  const std::string negative = (dir / "negative").string(), huge = (dir / "huge").string();
  for (const auto& [prefix, ids] :
       {std::pair{negative, std::vector<int32_t>{1, 2, -5, 3}},
        std::pair{huge, std::vector<int32_t>{2147483647, 1, 2147483647, 5}}}) {
    IndexedDatasetBuilder b(prefix, IndexDType::I32);
    b.add_item(std::vector<int32_t>{7, 8});
    b.end_document();
    b.add_item(ids);
    b.end_document();
    b.finalize();
  }
  auto r = run_cli("inspect-data '" + negative + "' --entropy");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(negative + ".bin: sequence 1 holds token id -5 at position 2"),
            std::string::npos) << r.output;
  // -(2/6 ln 2/6 + 4 x 1/6 ln 1/6) = 1.5607 nats over 5 distinct ids.
  r = run_cli("inspect-data '" + huge + "' --entropy");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("unigram entropy: 1.5607 nats/token over 5 distinct tokens"),
            std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::data
