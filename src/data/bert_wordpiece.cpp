// BERT WordPiece tokenizer; see bert_wordpiece.h for the exact semantics.
#include "data/bert_wordpiece.h"

#include <utf8proc.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/unicode.h"

namespace megatron::data {
namespace {

constexpr size_t kMaxWordChars = 200;

bool is_cjk(int32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_punctuation(int32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

// Python's str.isspace (what str.split() splits on).
bool is_python_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Unicode "Cased": letters with case, plus symbols such as U+24B6 that have a case mapping.
bool is_cased(int32_t c) {
  auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
         cat == UTF8PROC_CATEGORY_LT || utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
}

// Unicode "Case_Ignorable" (marks, format characters, modifiers, word-internal punctuation).
bool is_case_ignorable(int32_t c) {
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      break;
  }
  switch (c) {
    case '\'':
    case '.':
    case ':':
    case 0x00B7:
    case 0x0387:
    case 0x05F4:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
    case 0xFE13:
    case 0xFE52:
    case 0xFE55:
    case 0xFF07:
    case 0xFF0E:
    case 0xFF1A:
      return true;
    default:
      return false;
  }
}

// Python's Final_Sigma condition for word[i] (a capital sigma).
bool is_final_sigma(const std::vector<int32_t>& word, size_t i) {
  size_t j = i;
  while (j > 0 && is_case_ignorable(word[j - 1])) --j;
  if (j == 0 || !is_cased(word[j - 1])) return false;
  size_t k = i + 1;
  while (k < word.size() && is_case_ignorable(word[k])) ++k;
  return k == word.size() || !is_cased(word[k]);
}

// Lower-cases a word the way Python's str.lower does for BERT's purposes (simple mappings;
// capital sigma -> final sigma by Unicode's Final_Sigma rule; U+0130's "i" + U+0307 differs
// only in the mark, which stripping drops), then strips accents (NFD, drop Mn).
std::vector<int32_t> lower_and_strip(const std::vector<int32_t>& word) {
  std::vector<int32_t> out;
  out.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t c = word[i];
    int32_t lower;
    if (c == 0x03A3) {
      lower = is_final_sigma(word, i) ? 0x03C2 : 0x03C3;
    } else {
      lower = utf8proc_tolower(c);
    }
    utf8proc_int32_t buf[32];
    int last = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(lower, buf, 32, UTF8PROC_DECOMPOSE, &last);
    if (n < 0 || n > 32) {
      out.push_back(lower);
      continue;
    }
    for (utf8proc_ssize_t k = 0; k < n; ++k)
      if (utf8proc_category(buf[k]) != UTF8PROC_CATEGORY_MN) out.push_back(buf[k]);
  }
  return out;
}

std::string to_utf8(const std::vector<int32_t>& cps) {
  std::string s;
  for (int32_t c : cps) unicode::append_utf8(s, c);
  return s;
}

}  // namespace

BertWordPieceTokenizer::BertWordPieceTokenizer(const std::string& path, bool lower_case,
                                               int vocab_extra_ids)
    : lower_case_(lower_case) {
  MG_REQUIRE(vocab_extra_ids >= 0, "--vocab-extra-ids must be >= 0, got ", vocab_extra_ids);
  std::ifstream f(path, std::ios::binary);
  MG_REQUIRE(f.good(), "cannot open --vocab-file '", path, "' (check the path)");
  std::string line;
  size_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    size_t b = 0, e = line.size();
    auto ascii_space = [](char ch) { return uint8_t(ch) < 0x80 && is_python_space(uint8_t(ch)); };
    while (b < e && ascii_space(line[b])) ++b;
    while (e > b && ascii_space(line[e - 1])) --e;
    std::string tok = line.substr(b, e - b);
    for (size_t i = 0; i < tok.size();) {
      int len;
      MG_REQUIRE(unicode::decode_utf8(tok, i, len) != unicode::kInvalid, "--vocab-file '", path,
                 "' line ", line_no, ": not valid UTF-8");
      i += len;
    }
    auto [it, inserted] = vocab_.emplace(tok, int32_t(id_to_token_.size()));
    MG_REQUIRE(inserted, "--vocab-file '", path, "' line ", line_no, ": token '", tok,
               "' repeats line ", it->second + 1, "; every vocabulary line must be distinct");
    id_to_token_.push_back(tok);
  }
  MG_REQUIRE(!f.bad(), "error reading --vocab-file '", path, "'");
  MG_REQUIRE(!id_to_token_.empty(), "--vocab-file '", path, "' is empty");
  unk_ = id_of(path, "[UNK]");
  cls_ = id_of(path, "[CLS]");
  sep_ = id_of(path, "[SEP]");
  pad_ = id_of(path, "[PAD]");
  mask_ = id_of(path, "[MASK]");
  bos_ = add_token("[BOS]");
  eos_ = add_token("[EOS]");
  for (int i = 0; i < vocab_extra_ids; ++i) extra_ids_.push_back(add_token("<extra_id_" + std::to_string(i) + ">"));
}

int32_t BertWordPieceTokenizer::id_of(const std::string& path, const char* token) const {
  auto it = vocab_.find(std::string_view(token));
  MG_REQUIRE(it != vocab_.end(), "--vocab-file '", path, "' has no ", token,
             " token; a BERT vocabulary needs [UNK], [CLS], [SEP], [PAD] and [MASK]");
  return it->second;
}

int32_t BertWordPieceTokenizer::add_token(const std::string& token) {
  auto [it, inserted] = vocab_.emplace(token, int32_t(id_to_token_.size()));
  if (inserted) id_to_token_.push_back(token);
  return it->second;
}

std::vector<std::string> BertWordPieceTokenizer::basic_tokenize(std::string_view text) const {
  // Clean: code points with whitespace -> ' ', controls dropped, CJK surrounded by spaces.
  std::vector<int32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    int len;
    int32_t c = unicode::decode_utf8(text, i, len);
    i += len;
    if (c == unicode::kInvalid || c == 0 || c == 0xFFFD) continue;
    if (c == '\t' || c == '\n' || c == '\r' || c == ' ' ||
        utf8proc_category(c) == UTF8PROC_CATEGORY_ZS) {
      cps.push_back(' ');
      continue;
    }
    auto cat = utf8proc_category(c);
    if (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF) continue;
    if (is_cjk(c)) {
      cps.push_back(' ');
      cps.push_back(c);
      cps.push_back(' ');
    } else {
      cps.push_back(c);
    }
  }
  std::vector<std::string> words;
  std::vector<int32_t> word;
  auto flush_word = [&] {
    if (word.empty()) return;
    const std::vector<int32_t> w = lower_case_ ? lower_and_strip(word) : word;
    std::vector<int32_t> piece;
    for (int32_t c : w) {
      if (is_punctuation(c)) {
        if (!piece.empty()) words.push_back(to_utf8(piece));
        piece.clear();
        words.push_back(to_utf8({c}));
      } else if (is_python_space(c)) {  // stripping can expose none, but split() would split
        if (!piece.empty()) words.push_back(to_utf8(piece));
        piece.clear();
      } else {
        piece.push_back(c);
      }
    }
    if (!piece.empty()) words.push_back(to_utf8(piece));
    word.clear();
  };
  for (int32_t c : cps) {
    if (is_python_space(c))
      flush_word();
    else
      word.push_back(c);
  }
  flush_word();
  return words;
}

void BertWordPieceTokenizer::wordpiece(const std::string& word, std::vector<int32_t>& out) const {
  // Code point boundaries of the word.
  std::vector<size_t> bounds;
  for (size_t i = 0; i < word.size();) {
    bounds.push_back(i);
    int len;
    unicode::decode_utf8(word, i, len);
    i += len;
  }
  bounds.push_back(word.size());
  const size_t nchars = bounds.size() - 1;
  if (nchars > kMaxWordChars) {
    out.push_back(unk_);
    return;
  }
  const size_t mark = out.size();
  std::string candidate;
  for (size_t start = 0; start < nchars;) {
    size_t end = nchars;
    int32_t found = -1;
    while (start < end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(word, bounds[start], bounds[end] - bounds[start]);
      auto it = vocab_.find(std::string_view(candidate));
      if (it != vocab_.end()) {
        found = it->second;
        break;
      }
      --end;
    }
    if (found < 0) {
      out.resize(mark);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

void BertWordPieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  for (const std::string& w : basic_tokenize(text)) wordpiece(w, out);
}

const std::string& BertWordPieceTokenizer::token(int32_t id) const {
  MG_REQUIRE(id >= 0 && size_t(id) < id_to_token_.size(), type(), ": token id ", id,
             " is not in the vocabulary (size ", id_to_token_.size(), ")");
  return id_to_token_[id];
}

std::string BertWordPieceTokenizer::decode(std::span<const int32_t> ids) const {
  // ' '.join(tokens).replace(' ##', '').strip()
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) joined += ' ';
    joined += token(ids[i]);
  }
  std::string out;
  out.reserve(joined.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    if (joined.compare(i, 3, " ##") == 0) {
      i += 2;
      continue;
    }
    out += joined[i];
  }
  size_t b = out.find_first_not_of(" \t\n\r\v\f");
  if (b == std::string::npos) return "";
  size_t e = out.find_last_not_of(" \t\n\r\v\f");
  return out.substr(b, e - b + 1);
}

}  // namespace megatron::data
