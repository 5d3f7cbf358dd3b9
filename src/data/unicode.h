// Unicode helpers shared by the tokenizers: UTF-8 decoding that never fails (an invalid byte is
// reported as one "invalid" unit of length 1), the character classes the GPT-2 pre-tokenizer
// regex needs (\p{L}, \p{N}, \s = White_Space), and Python-compatible UTF-8 repair
// (bytes.decode(errors='replace')). Categories come from utf8proc (Unicode 15) and are cached
// in a flat table built once per process.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace megatron::data::unicode {

// Class of a code point for GPT-2 pre-tokenization.
enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// Marks a byte that does not start a valid UTF-8 sequence (returned by decode_utf8).
inline constexpr int32_t kInvalid = -1;

// Decodes the code point starting at s[i]; sets `len` to its byte length. Overlong forms,
// surrogates, code points above U+10FFFF and truncated sequences yield kInvalid with len = 1.
inline int32_t decode_utf8(std::string_view s, size_t i, int& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t left = s.size() - i;
  unsigned char b0 = p[0];
  len = 1;
  if (b0 < 0x80) return b0;
  auto cont = [&](size_t k) { return k < left && (p[k] & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (!cont(1)) return kInvalid;
    len = 2;
    return ((b0 & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(1) || !cont(2)) return kInvalid;
    int32_t c = ((b0 & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF)) return kInvalid;
    len = 3;
    return c;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return kInvalid;
    int32_t c = ((b0 & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    if (c < 0x10000 || c > 0x10FFFF) return kInvalid;
    len = 4;
    return c;
  }
  return kInvalid;
}

// The GPT-2 class of a code point (kInvalid -> kOther).
CharClass char_class(int32_t cp);

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value).
void append_utf8(std::string& out, int32_t cp);

// Returns `bytes` with every ill-formed subsequence replaced by U+FFFD exactly as Python's
// bytes.decode('utf-8', errors='replace') does (one U+FFFD per maximal ill-formed subpart).
std::string repair_utf8(std::string_view bytes);

}  // namespace megatron::data::unicode
