// Unicode helpers for the tokenizers; see unicode.h.
#include "data/unicode.h"

#include <utf8proc.h>

#include <vector>

namespace megatron::data::unicode {
namespace {

// White_Space property (what \s means in the regex engines GPT-2 and tiktoken use).
bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

CharClass compute_class(int32_t c) {
  if (is_white_space(c)) return CharClass::kSpace;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

const std::vector<uint8_t>& class_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x110000);
    for (int32_t c = 0; c < 0x110000; ++c) t[c] = uint8_t(compute_class(c));
    return t;
  }();
  return table;
}

}  // namespace

CharClass char_class(int32_t cp) {
  if (cp < 0 || cp >= 0x110000) return CharClass::kOther;
  return CharClass(class_table()[cp]);
}

void append_utf8(std::string& out, int32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    int len;
    if (decode_utf8(s, i, len) != kInvalid) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    // Maximal subpart: a lead byte followed by the continuation bytes that could still have
    // completed a valid sequence (second-byte limits as in the Unicode standard, Table 3-7).
    unsigned char b0 = p[i];
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF)
      need = 1;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    size_t k = 1;
    if (need > 0 && i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi) {
      k = 2;
      while (k <= need && i + k < n && (p[i + k] & 0xC0) == 0x80) ++k;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

}  // namespace megatron::data::unicode
