// Deterministic stress text for the tokenizer parity tests: tricky fragments (code, whitespace
// runs with tabs and \r\n, numbers, contractions, accented Latin, CJK, emoji with ZWJ
// sequences, combining marks, unusual Unicode spaces, punctuation runs) and long pieces; and
// documents holding invalid UTF-8.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace megatron::data {

inline std::vector<std::string> stress_documents() {
  const std::vector<std::string> fragments = {
      "Hello", "world", "IT'S", "it's", "don't", "we'LL", "they're", "I'd", "'s", "''", "'",
      "O'Neil's", "rock'n'roll", "123", "3.14159", "1,000,000", "0x7fff", "42nd", "¾", "Ⅻ",
      "٣٤٥", "१२३", "café", "naïve", "Ångström", "résumé", "Zoë", "façade", "Straße", "ΟΛΟΣ",
      "Привет", "мир", "東京", "日本語のテキスト", "中文字符", "한국어", "ไทย", "عربى", "עברית",
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "e\u0301", "a\u0308\u0301", "\u0915\u094D\u0937",
      "int main() { return 0; }", "for (i = 0; i < n; ++i) {", "x+=1;", "def f(x):", "->",
      "#include <vector>", "std::string", "a_b_c", "__init__", "http://example.com/a?b=c&d=e",
      "!!!", "...", "?!?", "---", "***", "(", ")", "[]", "{}", "<|endoftext|>", "<|im_start|>",
      "\u00a0", "\u2009", "\u3000", "\u200b", "\u2028", "\u0085", "\ufeff", "\t", "\x0b", "\x0c",
      "$", "€100", "£", "%", "@user", "#hashtag", "ﬁ", "Ⓐ", "\U0001D400", "\U00020000",
      // Case-folding contractions ('ſ folds to 's, K is the Kelvin sign), U+180E (not
      // White_Space since Unicode 6.3), control characters, surrogate-range-free astral marks.
      "'ſ", "'\u212a", "\u180e", "\x01\x02", "\x7f", "\x1b[0m", "x\u180ey"};
  const std::vector<std::string> separators = {
      " ", " ", " ", "", "  ", "   ", "\n", "\n\n", "\r\n", "\r\n\r\n", "\t", "\t\t", " \t ",
      "\n    ", "\n\t", " \n", "\u00a0", "\u3000 ", "        "};
  std::mt19937 rng(1234);
  std::vector<std::string> docs;
  for (int d = 0; d < 400; ++d) {
    std::string doc;
    int n = 20 + int(rng() % 300);
    for (int k = 0; k < n; ++k) {
      doc += fragments[rng() % fragments.size()];
      doc += separators[rng() % separators.size()];
    }
    docs.push_back(doc);
  }
  docs.push_back(std::string(5000, ' ') + "x" + std::string(3000, '\n'));
  docs.push_back(std::string(20000, 'a'));
  // Long single pieces (merged by the heap-based path): random letters from small and large
  // alphabets, repeated patterns with many equal-rank pairs, punctuation and digit runs.
  auto random_run = [&](const std::string& alphabet, int len) {
    std::string s;
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  docs.push_back(random_run("abcdefghijklmnopqrstuvwxyz", 3000));
  docs.push_back(" " + random_run("ahelo", 4000) + " " + random_run("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", 2000));
  docs.push_back(random_run("!@#$%^&*()-=+[]{};:,.<>/?|~", 2500) + " " + random_run("0123456789", 3000));
  std::string pattern;
  for (int k = 0; k < 700; ++k) pattern += k % 3 ? "ab" : "aab";
  docs.push_back(pattern + "\n" + pattern.substr(1));
  docs.push_back("");
  return docs;
}

// Documents holding invalid UTF-8: hand-picked cases (lone continuation and lead bytes, truncated
// sequences mid-word and at the end, overlong forms, encoded surrogates, code points above
// U+10FFFF, stray bytes beside special-token strings, digits, contractions, whitespace runs and
// decomposed characters) and stress documents with invalid bytes put at random byte offsets
// (some land inside multi-byte characters, cutting them).
inline std::vector<std::string> invalid_utf8_documents() {
  std::vector<std::string> docs = {
      "a\xff\xfe b\xc3", "x\xe6\x9dy", "\xed\xa0\x80z", "ok\xc0\x80", "\x80\x80\x80", "caf\xc3",
      "\xf0\x9f\x98 smile \xf0\x9f\x98\x80", "\xf4\x90\x80\x80 above", "\xe0\x80\xaf overlong",
      "Hello\xff<|endoftext|>\xfe world", "<EOD>\xff<s>\xfe</s>\xc0<extra_id_0>",
      "<|im_start|>\xffuser\n<|im_end|>\x80", "e\xcc\x81\xff e\xcc\x81 \xfe\xcc\x81x",
      "   \xff   \n\n\xfe\t\t", "don\xff't it\xfe's", "123\xff" "4567\xfe" "8", "\xc3\xa9\xa9\xa9",
      "\xff", "\xff\xff\xff\xff\xff\xff\xff\xff", " \xff", "\xff \xfe  \xfd\n", "\xe2\x80 \xe2\x80\x83 x"};
  const std::string bad[] = {"\x80", "\xbf", "\xc0", "\xc1", "\xf5", "\xff", "\xfe", "\xc3", "\xe6\x9d",
                             "\xf0\x9f\x98", "\xed\xb0\x80"};
  std::mt19937 rng(99);
  const auto stress = stress_documents();
  for (size_t d = 0; d < 60; ++d) {
    std::string doc = stress[d].substr(0, 400);
    const int n = 1 + int(rng() % 6);
    for (int k = 0; k < n; ++k) doc.insert(rng() % (doc.size() + 1), bad[rng() % std::size(bad)]);
    docs.push_back(doc);
  }
  return docs;
}

}  // namespace megatron::data
