// Pre-tokenizer regexes (tiktoken patterns, tokenizer.json "Split" and "ByteLevel" patterns)
// through PCRE2 with JIT, in UTF mode with Unicode properties.
//
// The patterns are written for Rust's regex engines (tiktoken's fancy-regex, the tokenizers
// crate's onig), where \s is Unicode White_Space. PCRE2's \s also matches U+180E, so \s and \S
// are rewritten to the explicit White_Space set before compiling. Subjects may hold invalid UTF-8
// (PCRE2_MATCH_INVALID_UTF): an invalid byte never matches, and split() reports the text between
// matches as pieces of its own (flagged `matched = false`), so no byte is ever lost.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace megatron::data {

class RegexSplitter {
 public:
  // Throws megatron::Error with `what` (e.g. "tokenizer.json pre_tokenizer Split pattern") and the
  // compiler's message when the pattern does not compile.
  RegexSplitter(const std::string& pattern, const std::string& what);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls f(piece, matched) for the matches of the pattern in `text` and the gaps between them,
  // in order; together the pieces cover `text` exactly. Thread-safe.
  template <class F>
  void split(std::string_view text, F&& f) const {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t begin, end;
      if (!next_match(text, pos, begin, end)) {
        f(text.substr(pos), false);
        return;
      }
      if (begin > pos) f(text.substr(pos, begin - pos), false);
      f(text.substr(begin, end - begin), true);
      pos = end;
    }
  }

  const std::string& pattern() const { return pattern_; }

  // The pattern with \s and \S replaced by the Unicode White_Space set (exposed for tests).
  static std::string translate(const std::string& pattern);

 private:
  // Finds the first match at or after `pos`; an empty match is skipped one character at a time
  // (as regex find_iter does). Returns false when none is left.
  bool next_match(std::string_view text, size_t pos, size_t& begin, size_t& end) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
  std::string what_;
};

}  // namespace megatron::data
