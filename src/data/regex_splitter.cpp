// PCRE2-backed pre-tokenizer regex; see regex_splitter.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/regex_splitter.h"

#include <pcre2.h>

#include "core/error.h"

namespace megatron::data {

namespace {

// Unicode White_Space (what \s means in Rust's regex crate), as class items.
constexpr const char* kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Per-thread match state shared by every pattern: one match-data block (the ovector needs one
// pair) and a JIT stack large enough for long whitespace runs under lookahead.
struct ThreadScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadScratch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadScratch& scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

std::string RegexSplitter::translate(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        MG_REQUIRE(!in_class, "regex '", p, "': \\S inside a character class is not supported");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& what)
    : impl_(std::make_unique<Impl>()), pattern_(pattern), what_(what) {
  const std::string translated = translate(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset,
                              nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof msg);
    MG_THROW(what, " '", pattern, "' does not compile as a regex: ", reinterpret_cast<char*>(msg),
             " (at offset ", offset, " of '", translated, "')");
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() = default;

bool RegexSplitter::next_match(std::string_view text, size_t pos, size_t& begin,
                               size_t& end) const {
  ThreadScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos < text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, s.data,
                                                s.context)
                              : pcre2_match(impl_->code, subject, text.size(), pos, 0, s.data,
                                            s.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      MG_THROW(what_, " '", pattern_, "': matching failed on a text of ", text.size(),
               " bytes: ", reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    begin = ov[0];
    end = ov[1];
    if (end > begin) return true;
    // Empty match: no piece; go on from the next character.
    pos = begin + 1;
    while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
  }
  return false;
}

}  // namespace megatron::data
