#include "data/tokenizer.h"

#include <charconv>

#include "core/error.h"

namespace megatron::data {

int32_t Tokenizer::eod_or_throw() const {
  auto e = eod();
  MG_REQUIRE(e.has_value(), "tokenizer ", type(), " has no end-of-document token");
  return *e;
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tp) {
  MG_REQUIRE(divisible_by >= 1, "--make-vocab-size-divisible-by must be >= 1, got ", divisible_by);
  MG_REQUIRE(tp >= 1, "--tensor-model-parallel-size must be >= 1, got ", tp);
  int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

NullTokenizer::NullTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {
  MG_REQUIRE(vocab_size >= 2 && vocab_size <= INT32_MAX,
             "NullTokenizer needs --vocab-size between 2 and 2^31-1, got ", vocab_size);
}

void NullTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
      ++i;
    if (i == text.size()) break;
    size_t j = i;
    while (j < text.size() && !(text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r'))
      ++j;
    int64_t v = 0;
    auto [p, ec] = std::from_chars(text.data() + i, text.data() + j, v);
    MG_REQUIRE(ec == std::errc() && p == text.data() + j,
               "NullTokenizer: '", text.substr(i, j - i), "' is not an integer token id");
    MG_REQUIRE(v >= 0 && v < vocab_size_, "NullTokenizer: token id ", v,
               " is outside the vocabulary [0, ", vocab_size_, ")");
    out.push_back(int32_t(v));
    i = j;
  }
}

std::string NullTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    MG_REQUIRE(ids[i] >= 0 && ids[i] < vocab_size_, "NullTokenizer: cannot decode id ", ids[i]);
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace megatron::data
