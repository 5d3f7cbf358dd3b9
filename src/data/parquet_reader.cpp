// Parquet string-column reader; see parquet_reader.h.
#include "data/parquet_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/input_bounds.h"
#include "data/parquet_codec.h"
#include "data/parquet_thrift.h"

namespace megatron::data {

namespace {

using thrift::CompactReader;

enum PhysicalType { kByteArray = 6 };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
enum Encoding {
  kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6, kDeltaByteArray = 7, kRleDictionary = 8,
};

// A bounds-checked cursor over a decoded page.
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  const std::string* where;

  size_t left() const { return size_t(end - p); }
  [[noreturn]] void fail(const std::string& what) const { MG_THROW(*where, ": ", what); }
  void need(uint64_t n) const {
    if (n > left()) fail("page data ends early (needs " + std::to_string(n) + " bytes, " +
                         std::to_string(left()) + " left); the file is truncated or corrupted");
  }
  uint8_t byte() {
    need(1);
    return *p++;
  }
  uint32_t u32() {
    need(4);
    uint32_t v;
    std::memcpy(&v, p, 4);
    p += 4;
    return v;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a varint longer than 10 bytes in page data");
  }
  int64_t zigzag() {
    const uint64_t v = varint();
    return int64_t(v >> 1) ^ -int64_t(v & 1);
  }
  std::string_view take(uint64_t n) {
    need(n);
    std::string_view s(reinterpret_cast<const char*>(p), size_t(n));
    p += n;
    return s;
  }
};

// Reads `count` values of the RLE / bit-packed hybrid with `bit_width` bits each.
void read_hybrid(Cursor& c, int bit_width, size_t count, std::vector<uint32_t>& out) {
  if (bit_width < 0 || bit_width > 32) c.fail("bit width " + std::to_string(bit_width) + " out of range");
  out.clear();
  out.reserve(std::min<size_t>(count, size_t(1) << 20));  // the count is the file's word
  const size_t value_bytes = size_t(bit_width + 7) / 8;
  while (out.size() < count) {
    const uint64_t header = c.varint();
    if (header & 1) {  // bit-packed: (header >> 1) groups of 8 values
      const uint64_t groups = header >> 1;
      const uint64_t bytes = groups * uint64_t(bit_width);
      if (groups == 0 || groups > c.left()) c.fail("a bit-packed run longer than the page");
      c.need(bytes);
      uint64_t acc = 0;
      int bits = 0;
      const uint8_t* q = c.p;
      for (uint64_t k = 0; k < groups * 8 && out.size() < count; ++k) {
        while (bits < bit_width) {
          acc |= uint64_t(*q++) << bits;
          bits += 8;
        }
        out.push_back(bit_width == 0 ? 0 : uint32_t(acc & ((uint64_t(1) << bit_width) - 1)));
        acc >>= bit_width;
        bits -= bit_width;
      }
      c.p += bytes;
    } else {  // run: (header >> 1) copies of one value
      const uint64_t run = header >> 1;
      if (run == 0) c.fail("an empty RLE run");
      uint32_t v = 0;
      for (size_t k = 0; k < value_bytes; ++k) v |= uint32_t(c.byte()) << (8 * k);
      if (bit_width < 32 && (v >> bit_width)) c.fail("an RLE value wider than its bit width");
      const size_t n = size_t(std::min<uint64_t>(run, count - out.size()));
      out.insert(out.end(), n, v);
    }
  }
}

// DELTA_BINARY_PACKED: `expected` int64 values; leaves the cursor after the encoded blocks.
std::vector<int64_t> read_delta_binary(Cursor& c, size_t expected) {
  const uint64_t block = c.varint(), miniblocks = c.varint(), total = c.varint();
  if (total != expected)
    c.fail("DELTA_BINARY_PACKED holds " + std::to_string(total) + " values where the page has " +
           std::to_string(expected));
  int64_t value = c.zigzag();
  if (block == 0 || block % 128 || miniblocks == 0 || block % miniblocks || (block / miniblocks) % 32)
    c.fail("a DELTA_BINARY_PACKED header with block size " + std::to_string(block) + " and " +
           std::to_string(miniblocks) + " miniblocks");
  const uint64_t per_mini = block / miniblocks;
  std::vector<int64_t> out;
  out.reserve(size_t(std::min<uint64_t>(total, uint64_t(1) << 20)));  // the file's word only
  if (total > 0) out.push_back(value);
  while (out.size() < total) {
    const int64_t min_delta = c.zigzag();
    std::string_view widths = c.take(miniblocks);
    for (uint64_t m = 0; m < miniblocks && out.size() < total; ++m) {
      const int w = uint8_t(widths[m]);
      if (w > 64) c.fail("a DELTA_BINARY_PACKED bit width above 64");
      const uint64_t bytes = per_mini * uint64_t(w) / 8;
      std::string_view packed = c.take(bytes);
      const auto* q = reinterpret_cast<const uint8_t*>(packed.data());
      unsigned __int128 acc = 0;
      int bits = 0;
      for (uint64_t k = 0; k < per_mini && out.size() < total; ++k) {
        while (bits < w) {
          acc |= (unsigned __int128)(*q++) << bits;
          bits += 8;
        }
        const uint64_t delta = w == 64 ? uint64_t(acc) : uint64_t(acc) & ((uint64_t(1) << w) - 1);
        acc >>= w;
        bits -= w;
        value = int64_t(uint64_t(value) + uint64_t(min_delta) + delta);
        out.push_back(value);
      }
    }
  }
  return out;
}

}  // namespace

struct ParquetFile::Column {
  std::string name;  // top-level name (leaves below a group get "group.leaf")
  int type = -1;
  int repetition = kRequired;
  int max_def = 0, max_rep = 0;
  bool top_level = true;
};

struct ParquetFile::Chunk {
  int codec = 0;
  int64_t num_values = 0;
  int64_t data_page_offset = -1, dictionary_page_offset = -1, total_compressed_size = 0;
  bool has_meta = false;
  bool external = false;  // file_path set: data in another file
};

ParquetFile::ParquetFile(const std::string& path) try : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MG_REQUIRE(fd_ >= 0, "cannot open --input ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd_);
    MG_THROW("--input ", path, " is a folder; give Parquet files (a glob such as 'dir/*.parquet')");
  }
  size_ = uint64_t(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) {
      ::close(fd_);
      MG_THROW("cannot map ", path, ": ", std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(m);
  }
  try {
    parse_footer();
  } catch (...) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    ::close(fd_);
    throw;
  }
} MG_CATCH_OUT_OF_MEMORY(path)

ParquetFile::~ParquetFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void ParquetFile::parse_footer() {
  MG_REQUIRE(size_ >= 12 && std::memcmp(data_, "PAR1", 4) == 0, path_,
             ": not a Parquet file (", size_ < 12 ? "shorter than the 12-byte frame" : "no PAR1 magic at the start",
             ")");
  MG_REQUIRE(std::memcmp(data_ + size_ - 4, "PAR1", 4) == 0, path_,
             ": no PAR1 magic at the end: the file is truncated (or encrypted, PARE, which is not "
             "supported)");
  uint32_t footer_len;
  std::memcpy(&footer_len, data_ + size_ - 8, 4);
  MG_REQUIRE(uint64_t(footer_len) + 12 <= size_, path_, ": the footer length ", footer_len,
             " exceeds the file size ", size_, "; the file is truncated or corrupted");
  CompactReader r(data_ + size_ - 8 - footer_len, footer_len, path_ + " footer (FileMetaData)");

  struct SchemaElement {
    std::string name;
    int type = -1, repetition = kRequired, num_children = 0;
  };
  std::vector<SchemaElement> schema;
  bool have_rows = false;
  r.read_struct([&](int16_t id, uint8_t t) {
    if (id == 2 && t == thrift::kList) {
      r.read_list([&](uint8_t et) {
        if (et != thrift::kStruct) r.fail("a schema element that is not a struct");
        SchemaElement e;
        r.read_struct([&](int16_t fid, uint8_t ft) {
          if (fid == 1 && ft == thrift::kI32) e.type = r.i32();
          else if (fid == 3 && ft == thrift::kI32) e.repetition = r.i32();
          else if (fid == 4 && ft == thrift::kBinary) e.name = std::string(r.binary());
          else if (fid == 5 && ft == thrift::kI32) e.num_children = r.i32();
          else r.skip(ft);
        });
        schema.push_back(std::move(e));
      });
    } else if (id == 3 && t == thrift::kI64) {
      num_rows_ = r.zigzag();
      have_rows = true;
    } else if (id == 4 && t == thrift::kList) {
      r.read_list([&](uint8_t et) {
        if (et != thrift::kStruct) r.fail("a row group that is not a struct");
        std::vector<Chunk> chunks;
        int64_t rows = -1;
        r.read_struct([&](int16_t fid, uint8_t ft) {
          if (fid == 1 && ft == thrift::kList) {
            r.read_list([&](uint8_t ct) {
              if (ct != thrift::kStruct) r.fail("a column chunk that is not a struct");
              Chunk c;
              r.read_struct([&](int16_t cid, uint8_t cft) {
                if (cid == 1 && cft == thrift::kBinary) {
                  c.external = !r.binary().empty();
                } else if (cid == 3 && cft == thrift::kStruct) {
                  c.has_meta = true;
                  r.read_struct([&](int16_t mid, uint8_t mt) {
                    if (mid == 4 && mt == thrift::kI32) c.codec = r.i32();
                    else if (mid == 5 && mt == thrift::kI64) c.num_values = r.zigzag();
                    else if (mid == 7 && mt == thrift::kI64) c.total_compressed_size = r.zigzag();
                    else if (mid == 9 && mt == thrift::kI64) c.data_page_offset = r.zigzag();
                    else if (mid == 11 && mt == thrift::kI64) c.dictionary_page_offset = r.zigzag();
                    else r.skip(mt);
                  });
                } else {
                  r.skip(cft);
                }
              });
              chunks.push_back(c);
            });
          } else if (fid == 3 && ft == thrift::kI64) {
            rows = r.zigzag();
          } else {
            r.skip(ft);
          }
        });
        if (rows < 0) r.fail("a row group without num_rows");
        row_groups_.push_back(std::move(chunks));
        row_group_rows_.push_back(rows);
      });
    } else {
      r.skip(t);
    }
  });
  MG_REQUIRE(!schema.empty() && have_rows && num_rows_ >= 0, path_,
             ": the footer has no schema or row count; the file is corrupted");

  // Flatten the schema tree into leaves (the column-chunk order), with their levels.
  size_t next = 1;
  auto walk = [&](auto&& self, int children, int def, int rep, const std::string& prefix,
                  bool top) -> void {
    for (int k = 0; k < children; ++k) {
      MG_REQUIRE(next < schema.size(), path_, ": the schema lists fewer elements than its groups "
                 "declare; the file is corrupted");
      const SchemaElement& e = schema[next++];
      const int d = def + (e.repetition != kRequired ? 1 : 0);
      const int rp = rep + (e.repetition == kRepeated ? 1 : 0);
      const std::string name = prefix.empty() ? e.name : prefix + "." + e.name;
      if (e.num_children > 0) {
        self(self, e.num_children, d, rp, name, false);
      } else {
        columns_.push_back({name, e.type, e.repetition, d, rp, top});
      }
    }
  };
  MG_REQUIRE(schema[0].num_children >= 0 && size_t(schema[0].num_children) < schema.size(), path_,
             ": the schema root declares ", schema[0].num_children, " children but the schema has ",
             schema.size(), " elements; the file is corrupted");
  walk(walk, schema[0].num_children, 0, 0, "", true);
  int64_t total = 0;
  for (size_t g = 0; g < row_groups_.size(); ++g) {
    MG_REQUIRE(row_groups_[g].size() == columns_.size(), path_, ": row group ", g, " has ",
               row_groups_[g].size(), " column chunks but the schema has ", columns_.size(),
               " columns; the file is corrupted");
    total += row_group_rows_[g];
  }
  MG_REQUIRE(total == num_rows_, path_, ": the row groups hold ", total, " rows but the footer says ",
             num_rows_, "; the file is corrupted");
}

int64_t ParquetFile::row_group_rows(size_t g) const { return row_group_rows_.at(g); }

std::vector<std::string> ParquetFile::column_names() const {
  std::vector<std::string> names;
  for (const Column& c : columns_) names.push_back(c.name);
  return names;
}

size_t ParquetFile::string_column(const std::string& name, const char* flag) const {
  std::string all;
  for (size_t k = 0; k < columns_.size(); ++k) {
    all += (k ? ", " : "") + columns_[k].name;
    if (columns_[k].name != name) continue;
    const Column& c = columns_[k];
    MG_REQUIRE(c.type == kByteArray && c.top_level && c.max_rep == 0, path_, ": column '", name,
               "' (", flag, ") does not hold plain strings (",
               c.max_rep ? "a list" : !c.top_level ? "a nested field" : "not BYTE_ARRAY",
               "); preprocess-data reads string columns");
    return k;
  }
  MG_THROW(path_, ": no column '", name, "' (", flag, "); the file has: ", all);
}

StringColumn ParquetFile::read(size_t g, size_t k) const try {
  MG_CHECK(g < row_groups_.size() && k < columns_.size(), "column chunk out of range");
  const Column& col = columns_[k];
  const Chunk& ch = row_groups_[g][k];
  const std::string where =
      path_ + ": row group " + std::to_string(g) + ", column '" + col.name + "'";
  MG_REQUIRE(ch.has_meta && !ch.external, where, ": the column chunk has no inline metadata "
             "(data in another file is not supported)");
  const int64_t rows = row_group_rows_[g];
  MG_REQUIRE(ch.num_values == rows, where, ": ", ch.num_values, " values for ", rows,
             " rows; the file is corrupted");
  int64_t start = ch.dictionary_page_offset > 0 ? ch.dictionary_page_offset : ch.data_page_offset;
  if (ch.dictionary_page_offset > 0 && ch.data_page_offset > 0)
    start = std::min(ch.dictionary_page_offset, ch.data_page_offset);
  MG_REQUIRE(start >= 4 && uint64_t(start) < size_, where, ": the first page offset ", start,
             " is outside the file (", size_, " bytes); the file is truncated or corrupted");

  StringColumn out;
  out.null_.reserve(size_t(std::min<int64_t>(rows, 1 << 20)));
  out.offsets_.reserve(size_t(std::min<int64_t>(rows, 1 << 20)) + 1);
  std::vector<std::string> dictionary;
  bool have_dictionary = false;
  std::vector<uint32_t> levels, indices;
  uint64_t pos = uint64_t(start);
  int page = 0;
  auto append = [&](std::string_view v) {
    out.data_.append(v);
    out.offsets_.push_back(out.data_.size());
    out.null_.push_back(false);
  };
  auto append_null = [&] {
    out.offsets_.push_back(out.data_.size());
    out.null_.push_back(true);
  };
  while (int64_t(out.null_.size()) < rows) {
    const std::string pw = where + ", page " + std::to_string(page++);
    MG_REQUIRE(pos < size_ - 8, pw, ": starts at byte ", pos, ", past the data; the file is truncated "
               "or corrupted (", out.null_.size(), " of ", rows, " values read)");
    // ---- page header
    CompactReader r(data_ + pos, size_t(size_ - 8 - pos), pw + " header");
    int type = -1, uncompressed = -1, compressed = -1;
    int num_values = -1, encoding = -1, num_nulls = 0, def_len = 0, rep_len = 0;
    bool v2_compressed = true, has_crc = false;
    uint32_t crc = 0;
    r.read_struct([&](int16_t id, uint8_t t) {
      if (id == 1 && t == thrift::kI32) type = r.i32();
      else if (id == 2 && t == thrift::kI32) uncompressed = r.i32();
      else if (id == 3 && t == thrift::kI32) compressed = r.i32();
      else if (id == 4 && t == thrift::kI32) has_crc = true, crc = uint32_t(r.i32());
      else if ((id == 5 || id == 7 || id == 8) && t == thrift::kStruct)
        r.read_struct([&](int16_t f, uint8_t ft) {
          if (f == 1 && ft == thrift::kI32) num_values = r.i32();
          else if (id == 8 && f == 2 && ft == thrift::kI32) num_nulls = r.i32();
          else if (id == 8 && f == 4 && ft == thrift::kI32) encoding = r.i32();
          else if (id != 8 && f == 2 && ft == thrift::kI32) encoding = r.i32();
          else if (id == 8 && f == 5 && ft == thrift::kI32) def_len = r.i32();
          else if (id == 8 && f == 6 && ft == thrift::kI32) rep_len = r.i32();
          else if (id == 8 && f == 7 && (ft == thrift::kTrue || ft == thrift::kFalse))
            v2_compressed = CompactReader::bool_of(ft);
          else r.skip(ft);
        });
      else r.skip(t);
    });
    pos += r.position();
    MG_REQUIRE(compressed >= 0 && uncompressed >= 0 && uint64_t(compressed) <= size_ - 8 - pos, pw,
               ": page of ", compressed, " bytes at byte ", pos, " runs past the end of the file (",
               size_, " bytes); the file is truncated or corrupted");
    std::string_view body(reinterpret_cast<const char*>(data_ + pos), size_t(compressed));
    pos += uint64_t(compressed);
    // The optional page checksum: CRC-32 of the page bytes as stored.
    MG_REQUIRE(!has_crc || uint32_t(::crc32(0, reinterpret_cast<const Bytef*>(body.data()),
                                            uInt(body.size()))) == crc,
               pw, ": page checksum (CRC-32) mismatch; the file is corrupted");
    if (type == kIndexPage) continue;
    MG_REQUIRE(type == kDataPage || type == kDataPageV2 || type == kDictionaryPage, pw,
               ": unknown page type ", type, "; the file is corrupted");
    MG_REQUIRE(num_values >= 0 && uint64_t(num_values) <= uint64_t(uncompressed) * 8 + uint64_t(rows), pw,
               ": invalid value count ", num_values);

    if (type == kDictionaryPage) {
      MG_REQUIRE(encoding == kPlain || encoding == kPlainDictionary, pw,
                 ": dictionary page encoding ", encoding, " is not PLAIN");
      const std::string plain = parquet_decompress(ch.codec, body, size_t(uncompressed), pw);
      Cursor c{reinterpret_cast<const uint8_t*>(plain.data()),
               reinterpret_cast<const uint8_t*>(plain.data()) + plain.size(), &pw};
      dictionary.clear();
      MG_REQUIRE(uint64_t(num_values) <= plain.size() / 4, pw, ": a dictionary page of ",
                 plain.size(), " bytes cannot hold ", num_values, " values; the file is corrupted");
      for (int i = 0; i < num_values; ++i) dictionary.emplace_back(c.take(c.u32()));
      have_dictionary = true;
      continue;
    }
    // ---- levels and values
    std::string page_bytes;
    Cursor c{nullptr, nullptr, &pw};
    size_t non_null = size_t(num_values);
    levels.clear();
    if (type == kDataPage) {
      page_bytes = parquet_decompress(ch.codec, body, size_t(uncompressed), pw);
      c = Cursor{reinterpret_cast<const uint8_t*>(page_bytes.data()),
                 reinterpret_cast<const uint8_t*>(page_bytes.data()) + page_bytes.size(), &pw};
      MG_REQUIRE(col.max_rep == 0, pw, ": repeated columns are not supported");
      if (col.max_def > 0) {
        const uint32_t len = c.u32();
        Cursor lc{c.p, c.p + std::min<uint64_t>(len, c.left()), &pw};
        c.need(len);
        read_hybrid(lc, 1, size_t(num_values), levels);
        c.p += len;
      }
    } else {
      MG_REQUIRE(def_len >= 0 && rep_len == 0 && uint64_t(def_len) <= body.size(), pw,
                 ": invalid level lengths (definition ", def_len, ", repetition ", rep_len, ")");
      if (col.max_def > 0) {
        Cursor lc{reinterpret_cast<const uint8_t*>(body.data()),
                  reinterpret_cast<const uint8_t*>(body.data()) + def_len, &pw};
        read_hybrid(lc, 1, size_t(num_values), levels);
      }
      std::string_view values = body.substr(size_t(def_len));
      const int64_t values_size = int64_t(uncompressed) - def_len;
      MG_REQUIRE(values_size >= 0, pw, ": uncompressed size smaller than its levels");
      page_bytes = v2_compressed ? parquet_decompress(ch.codec, values, size_t(values_size), pw)
                                 : std::string(values);
      c = Cursor{reinterpret_cast<const uint8_t*>(page_bytes.data()),
                 reinterpret_cast<const uint8_t*>(page_bytes.data()) + page_bytes.size(), &pw};
      (void)num_nulls;
    }
    if (!levels.empty()) {
      non_null = 0;
      for (uint32_t l : levels) non_null += l == 1;
    }
    MG_REQUIRE(int64_t(out.null_.size()) + num_values <= rows, pw, ": more values than the row group's ",
               rows, " rows; the file is corrupted");
    // Decode the non-null values into `vals` (views into page_bytes or the dictionary).
    std::vector<std::string_view> vals;
    std::vector<std::string> owned;  // DELTA_BYTE_ARRAY rebuilds values
    vals.reserve(std::min<size_t>(non_null, page_bytes.size() / 4 + 1));
    if (encoding == kPlain) {
      for (size_t i = 0; i < non_null; ++i) vals.push_back(c.take(c.u32()));
    } else if (encoding == kPlainDictionary || encoding == kRleDictionary) {
      MG_REQUIRE(have_dictionary, pw, ": dictionary-encoded page without a dictionary page");
      const int width = c.byte();
      read_hybrid(c, width, non_null, indices);
      for (uint32_t ix : indices) {
        MG_REQUIRE(ix < dictionary.size(), pw, ": dictionary index ", ix, " out of range (",
                   dictionary.size(), " entries); the file is corrupted");
        vals.push_back(dictionary[ix]);
      }
    } else if (encoding == kDeltaLengthByteArray) {
      const std::vector<int64_t> lengths = read_delta_binary(c, non_null);
      MG_REQUIRE(lengths.size() == non_null, pw, ": ", lengths.size(), " lengths for ", non_null, " values");
      for (int64_t len : lengths) {
        MG_REQUIRE(len >= 0, pw, ": negative string length");
        vals.push_back(c.take(uint64_t(len)));
      }
    } else if (encoding == kDeltaByteArray) {
      const std::vector<int64_t> prefix = read_delta_binary(c, non_null);
      const std::vector<int64_t> suffix_len = read_delta_binary(c, non_null);
      MG_REQUIRE(prefix.size() == non_null && suffix_len.size() == non_null, pw,
                 ": DELTA_BYTE_ARRAY counts do not match ", non_null, " values");
      owned.reserve(std::min<size_t>(non_null, page_bytes.size() + 1));
      for (size_t i = 0; i < non_null; ++i) {
        const std::string& prev = i ? owned.back() : std::string();
        MG_REQUIRE(prefix[i] >= 0 && uint64_t(prefix[i]) <= (i ? prev.size() : 0) && suffix_len[i] >= 0,
                   pw, ": invalid DELTA_BYTE_ARRAY prefix or suffix length");
        std::string v = i ? prev.substr(0, size_t(prefix[i])) : std::string();
        v += c.take(uint64_t(suffix_len[i]));
        owned.push_back(std::move(v));
      }
      for (const auto& v : owned) vals.push_back(v);
    } else {
      MG_THROW(pw, ": encoding ", encoding,
               " is not supported (PLAIN, dictionary, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY)");
    }
    size_t next = 0;
    for (int i = 0; i < num_values; ++i) {
      if (!levels.empty() && levels[size_t(i)] != 1) append_null();
      else append(vals[next++]);
    }
  }
  return out;
} MG_CATCH_OUT_OF_MEMORY(path_ + ": row group " + std::to_string(g))

}  // namespace megatron::data
