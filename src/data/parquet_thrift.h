// A bounds-checked reader of Thrift's compact protocol, the encoding of Parquet's footer
// (FileMetaData) and page headers. Every read checks the remaining bytes and nesting depth, and
// a malformed buffer throws megatron::Error with the context given at construction (the file
// and the structure being read), so a corrupted file can never crash, hang or read out of bounds.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"

namespace megatron::data::thrift {

enum Type : uint8_t {
  kStop = 0, kTrue = 1, kFalse = 2, kByte = 3, kI16 = 4, kI32 = 5, kI64 = 6, kDouble = 7,
  kBinary = 8, kList = 9, kSet = 10, kMap = 11, kStruct = 12,
};

class CompactReader {
 public:
  CompactReader(const uint8_t* data, size_t size, std::string context)
      : p_(data), end_(data + size), begin_(data), context_(std::move(context)) {}

  size_t position() const { return size_t(p_ - begin_); }

  uint8_t byte() {
    need(1);
    return *p_++;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a varint longer than 10 bytes");
  }
  int64_t zigzag() {
    const uint64_t v = varint();
    return int64_t(v >> 1) ^ -int64_t(v & 1);
  }
  int32_t i32() {
    const int64_t v = zigzag();
    if (v < INT32_MIN || v > INT32_MAX) fail("an i32 out of range");
    return int32_t(v);
  }
  std::string_view binary() {
    const uint64_t n = varint();
    need(n);
    std::string_view s(reinterpret_cast<const char*>(p_), size_t(n));
    p_ += n;
    return s;
  }
  // A boolean struct field's value lives in its type nibble.
  static bool bool_of(uint8_t type) { return type == kTrue; }

  // Calls on_field(id, type) for each field of a struct; on_field reads the value with the
  // typed readers or calls skip(type).
  template <class F>
  void read_struct(F&& on_field) {
    Depth guard(*this);
    int16_t last = 0;
    for (;;) {
      const uint8_t h = byte();
      const uint8_t type = h & 0x0F;
      if (type == kStop) return;
      int16_t id;
      if (h >> 4) {
        id = int16_t(last + (h >> 4));
      } else {
        const int64_t v = zigzag();
        if (v < INT16_MIN || v > INT16_MAX) fail("a field id out of range");
        id = int16_t(v);
      }
      last = id;
      on_field(id, type);
    }
  }

  // Calls on_element(element_type) `size` times for a list or set.
  template <class F>
  void read_list(F&& on_element) {
    const uint8_t h = byte();
    uint64_t size = h >> 4;
    if (size == 15) size = varint();
    const uint8_t type = h & 0x0F;
    // Every element takes at least one byte (except bools packed in the type of an empty list).
    if (size > uint64_t(end_ - p_)) fail("a list longer than the bytes left");
    for (uint64_t i = 0; i < size; ++i) on_element(type);
  }

  void skip(uint8_t type) {
    Depth guard(*this);
    switch (type) {
      case kTrue: case kFalse: return;
      case kByte: byte(); return;
      case kI16: case kI32: case kI64: varint(); return;
      case kDouble: need(8); p_ += 8; return;
      case kBinary: binary(); return;
      case kList: case kSet: read_list([&](uint8_t t) { t == kTrue || t == kFalse ? (void)byte() : skip(t); }); return;
      case kMap: {
        const uint64_t n = varint();
        if (n == 0) return;
        const uint8_t kv = byte();
        if (n > uint64_t(end_ - p_)) fail("a map longer than the bytes left");
        for (uint64_t i = 0; i < n; ++i) {
          skip(kv >> 4);
          skip(kv & 0x0F);
        }
        return;
      }
      case kStruct: read_struct([&](int16_t, uint8_t t) { skip(t); }); return;
      default: fail("an unknown field type " + std::to_string(type));
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    MG_THROW(context_, ": corrupted metadata (", what, " at byte ", position(),
             "); the file is damaged or not Parquet");
  }

 private:
  struct Depth {
    CompactReader& r;
    explicit Depth(CompactReader& reader) : r(reader) {
      if (++r.depth_ > 64) r.fail("structures nested deeper than 64");
    }
    ~Depth() { --r.depth_; }
  };
  void need(uint64_t n) const {
    if (n > uint64_t(end_ - p_)) fail("a value running past the end of its " + std::to_string(end_ - begin_) + " bytes");
  }

  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* begin_;
  std::string context_;
  int depth_ = 0;
};

}  // namespace megatron::data::thrift
