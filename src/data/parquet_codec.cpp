// Parquet page decompression with sizes bounded by the data; see parquet_codec.h.
#include "data/parquet_codec.h"

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace megatron::data {

namespace {

enum Codec { kUncompressed = 0, kSnappy = 1, kGzip = 2, kZstd = 6 };

const char* codec_name(int c) {
  static const char* names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? names[c] : "unknown";
}

// The most a compressed byte can expand to: deflate's limit is 1032:1 (zlib's documentation),
// Snappy's 64 bytes for a 3-byte copy; zstd's RLE blocks have no useful limit. A page's declared
// size beyond its codec's limit is refused before anything is allocated, and output buffers grow
// with the data actually decompressed (never the declared size up front), so a page claiming
// gigabytes in a small file costs nothing.
constexpr uint64_t kDeflateMaxRatio = 1032, kSnappyMaxRatio = 22;

void check_declared_size(std::string_view in, size_t expected, uint64_t ratio, const char* codec,
                         const std::string& where) {
  MG_REQUIRE(expected <= uint64_t(in.size()) * ratio + 64, where, ": the page says its ",
             in.size(), " bytes of ", codec, " data hold ", expected, " bytes, more than ", codec,
             " can expand them to (", ratio, "x); the file is corrupted");
}

// Grows `out` toward `expected` as decompressed data arrives (doubling, from a size bounded by
// the compressed input).
size_t next_capacity(size_t have, size_t in_size, size_t expected) {
  const size_t start = std::max<size_t>(in_size * 4, size_t(64) << 10);
  return std::min(expected, std::max(start, have * 2));
}

}  // namespace

std::string parquet_decompress(int codec, std::string_view in, size_t expected,
                               const std::string& where) {
  std::string out;
  switch (codec) {
    case kUncompressed:
      return std::string(in);
    case kSnappy: {
      check_declared_size(in, expected, kSnappyMaxRatio, "SNAPPY", where);
      size_t n = 0;
      MG_REQUIRE(snappy::GetUncompressedLength(in.data(), in.size(), &n) && n == expected &&
                     snappy::Uncompress(in.data(), in.size(), &out),
                 where, ": SNAPPY data does not decompress to the page's ", expected,
                 " bytes; the file is corrupted");
      return out;
    }
    case kZstd: {
      const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
      MG_REQUIRE(declared == ZSTD_CONTENTSIZE_UNKNOWN || declared == expected, where,
                 ": ZSTD data declares ", declared, " bytes but the page says ", expected,
                 "; the file is corrupted");
      std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> z(ZSTD_createDStream(),
                                                                 ZSTD_freeDStream);
      MG_CHECK(z != nullptr, "ZSTD_createDStream failed");
      ZSTD_inBuffer src{in.data(), in.size(), 0};
      size_t done = 0, rc = 1;
      while (rc != 0 && done < expected) {
        out.resize(next_capacity(out.size(), in.size(), expected));
        ZSTD_outBuffer dst{out.data(), out.size(), done};
        rc = ZSTD_decompressStream(z.get(), &dst, &src);
        MG_REQUIRE(!ZSTD_isError(rc), where, ": ZSTD data does not decompress (",
                   ZSTD_getErrorName(rc), "); the file is corrupted");
        MG_REQUIRE(dst.pos > done || src.pos < src.size || rc == 0, where,
                   ": ZSTD data ends before the page's ", expected, " bytes; the file is corrupted");
        done = dst.pos;
      }
      // The frame must end exactly there: no more output, no input left over.
      uint8_t extra = 0;
      ZSTD_outBuffer probe{&extra, 1, 0};
      const size_t more = rc == 0 ? 0 : ZSTD_decompressStream(z.get(), &probe, &src);
      MG_REQUIRE(done == expected && more == 0 && probe.pos == 0 && src.pos == src.size, where,
                 ": ZSTD data does not decompress to the page's ", expected,
                 " bytes; the file is corrupted");
      out.resize(done);
      return out;
    }
    case kGzip: {
      check_declared_size(in, expected, kDeflateMaxRatio, "GZIP", where);
      z_stream z{};
      MG_CHECK(inflateInit2(&z, 15 + 32) == Z_OK, "inflateInit2 failed");  // gzip or zlib header
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      z.avail_in = uInt(in.size());
      int rc = Z_OK;
      while (rc == Z_OK && z.total_out < expected) {
        out.resize(next_capacity(out.size(), in.size(), expected));
        z.next_out = reinterpret_cast<Bytef*>(out.data()) + z.total_out;
        z.avail_out = uInt(out.size() - z.total_out);
        rc = inflate(&z, Z_NO_FLUSH);
      }
      if (rc == Z_OK && z.total_out == expected) {  // exactly full: the stream must end here
        uint8_t extra = 0;
        z.next_out = &extra;
        z.avail_out = 1;
        rc = inflate(&z, Z_FINISH);
      }
      const size_t n = z.total_out;
      inflateEnd(&z);
      MG_REQUIRE(rc == Z_STREAM_END && n == expected, where,
                 ": GZIP data does not decompress to the page's ", expected,
                 " bytes; the file is corrupted");
      out.resize(n);
      return out;
    }
    default:
      MG_THROW(where, ": compression ", codec_name(codec),
               " is not supported (UNCOMPRESSED, SNAPPY, GZIP, ZSTD); rewrite the file with one of "
               "these, e.g. pandas df.to_parquet(path, compression='zstd')");
  }
}

}  // namespace megatron::data
