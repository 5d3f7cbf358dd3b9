// Rule-based sentence splitting; the rules are listed in sentence_splitter.h.
#include "data/sentence_splitter.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace megatron::data {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Length of a closing quote/bracket at text[i] (0 if none). Handles the UTF-8 ” ’ ».
size_t closer_length(std::string_view t, size_t i) {
  char c = t[i];
  if (c == '"' || c == '\'' || c == ')' || c == ']') return 1;
  if (t.substr(i, 3) == "\xE2\x80\x9D" || t.substr(i, 3) == "\xE2\x80\x99") return 3;
  if (t.substr(i, 2) == "\xC2\xBB") return 2;
  return 0;
}

bool can_start_sentence(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '"' || c == '\'' || c == '(' ||
         c == '[' || u >= 0x80;
}

bool is_abbreviation(std::string_view word) {
  static constexpr std::array<std::string_view, 32> kAbbrev = {
      "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "inc", "ltd",
      "co", "corp", "fig", "no", "vol", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
      "sep", "sept", "oct", "nov", "dec", "gen", "rev", "approx"};
  std::string lower(word);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  return std::find(kAbbrev.begin(), kAbbrev.end(), lower) != kAbbrev.end();
}

// Whether the '.' at text[dot] is part of an abbreviation or an initial.
bool period_is_abbreviation(std::string_view t, size_t dot) {
  size_t start = dot;
  while (start > 0 && !is_space(t[start - 1]) && t[start - 1] != '(' && t[start - 1] != '"')
    --start;
  std::string_view word = t.substr(start, dot - start);
  if (word.empty()) return false;
  if (word.size() == 1 && std::isalpha(static_cast<unsigned char>(word[0]))) return true;
  if (word.find('.') != std::string_view::npos) return true;
  return is_abbreviation(word);
}

}  // namespace

std::vector<std::string_view> split_sentences(std::string_view t, bool keep_newlines) {
  std::vector<std::string_view> out;
  auto emit = [&](size_t begin, size_t end) {
    while (begin < end && is_space(t[begin])) ++begin;
    if (begin < end) out.push_back(t.substr(begin, end - begin));
  };
  size_t start = 0, i = 0;
  const size_t n = t.size();
  while (i < n) {
    bool terminator = t[i] == '.' || t[i] == '!' || t[i] == '?';
    size_t term_len = 1;
    if (!terminator && t.substr(i, 3) == "\xE2\x80\xA6") terminator = true, term_len = 3;
    if (!terminator) {
      ++i;
      continue;
    }
    const size_t first_term = i;
    size_t j = i + term_len;
    while (j < n && (t[j] == '.' || t[j] == '!' || t[j] == '?')) ++j;
    bool single_period = t[first_term] == '.' && j == first_term + 1;
    while (j < n) {
      size_t c = closer_length(t, j);
      if (!c) break;
      j += c;
    }
    const size_t sentence_end = j;
    size_t k = j;
    while (k < n && is_space(t[k])) ++k;
    const bool boundary = k > j && k < n && can_start_sentence(t[k]) &&
                          !(single_period && period_is_abbreviation(t, first_term));
    if (!boundary) {
      i = j;
      continue;
    }
    size_t end = sentence_end;
    if (keep_newlines) {
      for (size_t q = j; q < k; ++q)
        if (t[q] == '\n') end = q + 1;
    }
    emit(start, end);
    start = k;
    i = k;
  }
  // The last sentence: trailing whitespace dropped, or its trailing newlines kept.
  size_t end = n;
  while (end > start && is_space(t[end - 1])) --end;
  if (keep_newlines) {
    for (size_t q = end; q < n; ++q)
      if (t[q] == '\n') end = q + 1;
  }
  emit(start, end);
  return out;
}

}  // namespace megatron::data
