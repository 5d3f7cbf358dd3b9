// Zero-shot LAMBADA and WikiText evaluation; see evaluate.h.
#include "inference/evaluate.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace megatron::inference {

namespace {

// Code point of the UTF-8 sequence starting at s[i] and its length (an invalid byte: itself, 1).
std::pair<uint32_t, size_t> decode_at(const std::string& s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (len == 1 || i + len > s.size()) return {b, 1};
  uint32_t cp = b & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return {cp, len};
}

// Python's str.isspace (and the regex \s of str patterns).
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

// Bytes of the whitespace character starting at i (0: none).
size_t space_at(const std::string& s, size_t i) {
  if (i >= s.size()) return 0;
  const auto [cp, len] = decode_at(s, i);
  return is_python_space(cp) ? len : 0;
}

// Bytes of the whitespace character ending at `end` (0: none).
size_t space_before(const std::string& s, size_t end) {
  for (size_t len = 1; len <= 4 && len <= end; ++len) {
    const size_t start = end - len;
    if ((static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) continue;  // continuation byte
    return space_at(s, start) == len ? len : 0;
  }
  return 0;
}

// Python's str.replace: every non-overlapping occurrence, left to right, in one pass.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, pos)) {
    out.append(s, pos, hit - pos).append(to);
    pos = hit + from.size();
  }
  return out.append(s, pos, std::string::npos);
}

// re.sub(r"O\s*([^C]*?)\s*C", r"O\1C", s): the text between each opening character and the next
// closing one loses its surrounding whitespace.
std::string strip_inside(const std::string& s, char open, char close) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t p = s.find(open, pos);
    if (p == std::string::npos) break;
    const size_t q = s.find(close, p + 1);
    if (q == std::string::npos) break;  // no later opening character has a closing one either
    out.append(s, pos, p - pos).push_back(open);
    out.append(python_strip(s.substr(p + 1, q - p - 1))).push_back(close);
    pos = q + 1;
  }
  return out.append(s, pos, std::string::npos);
}

// re.sub(r"/' [0-9]/", r"/'[0-9]/", s): Megatron's pattern, replacement taken literally.
std::string slash_quote_digit(const std::string& s) {
  std::string out;
  size_t pos = 0;
  for (size_t p = s.find("/' ", pos); p != std::string::npos; p = s.find("/' ", pos)) {
    if (p + 4 < s.size() && std::isdigit(static_cast<unsigned char>(s[p + 3])) && s[p + 4] == '/') {
      out.append(s, pos, p - pos).append("/'[0-9]/");
      pos = p + 5;
    } else {
      out.append(s, pos, p + 1 - pos);
      pos = p + 1;
    }
  }
  return out.append(s, pos, std::string::npos);
}

std::string read_file(const std::filesystem::path& file, const char* what) {
  std::ifstream in(file, std::ios::binary);
  MG_REQUIRE(in, "cannot read ", what, " ", file.string(), ": no such file or not readable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool valid_utf8(const std::string& s, size_t* bad) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return *bad = i, false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return *bad = i, false;
    i += len;
  }
  return true;
}

}  // namespace

std::string python_strip(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end) {
    const size_t n = space_at(text, begin);
    if (n == 0) break;
    begin += n;
  }
  while (end > begin) {
    const size_t n = space_before(text, end);
    if (n == 0) break;
    end -= n;
  }
  return text.substr(begin, end - begin);
}

std::vector<std::string> python_split(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0, start = std::string::npos;
  while (i < text.size()) {
    const size_t n = space_at(text, i);
    if (n > 0) {
      if (start != std::string::npos) words.push_back(text.substr(start, i - start));
      start = std::string::npos;
      i += n;
    } else {
      if (start == std::string::npos) start = i;
      i += decode_at(text, i).second;
    }
  }
  if (start != std::string::npos) words.push_back(text.substr(start));
  return words;
}

std::string ptb_detokenize(const std::string& text) {
  std::string s = replace_all(text, " '", "'");
  s = replace_all(s, " \n", "\n");
  s = replace_all(s, "\n ", "\n");
  s = replace_all(s, " n't", "n't");
  s = replace_all(s, " N ", "1 ");
  s = replace_all(s, "$ 1", "$1");
  return replace_all(s, "# 1", "#1");
}

std::string wikitext_detokenize(const std::string& text) {
  // contractions
  std::string s = replace_all(text, "s '", "s'");
  s = slash_quote_digit(s);
  // number separators
  s = replace_all(s, " @-@ ", "-");
  s = replace_all(s, " @,@ ", ",");
  s = replace_all(s, " @.@ ", ".");
  // punctuation
  for (const char* p : {" : ", " ; ", " . ", " ! ", " ? ", " , "})
    s = replace_all(s, p, std::string(p + 1));  // " x " -> "x "
  // brackets and quotes
  s = strip_inside(s, '(', ')');
  s = strip_inside(s, '[', ']');
  s = strip_inside(s, '{', '}');
  s = strip_inside(s, '"', '"');
  s = strip_inside(s, '\'', '\'');
  // miscellaneous
  s = replace_all(s, "= = = =", "====");
  s = replace_all(s, "= = =", "===");
  s = replace_all(s, "= =", "==");
  s = replace_all(s, " \u00b0 ", "\u00b0");
  s = replace_all(s, " \n", "\n");
  s = replace_all(s, "\n ", "\n");
  s = replace_all(s, " N ", " 1 ");
  return replace_all(s, " 's", "'s");
}

std::optional<Detokenizer> detokenizer_for_path(const std::string& path) {
  if (path.find("ptb") != std::string::npos) return Detokenizer::Ptb;
  if (path.find("wiki") != std::string::npos) return Detokenizer::Wiki;
  if (path.find("lambada") != std::string::npos) return Detokenizer::Lambada;
  return std::nullopt;
}

std::string detokenize(Detokenizer d, const std::string& text) {
  switch (d) {
    case Detokenizer::Ptb: return ptb_detokenize(text);
    case Detokenizer::Wiki: return wikitext_detokenize(text);
    case Detokenizer::Lambada: return text;
  }
  return text;
}

std::vector<ZeroShotSample> build_lambada_samples(const std::filesystem::path& file,
                                                  const data::Tokenizer& tokenizer, bool strict,
                                                  int64_t seq_length) {
  const std::string content = read_file(file, "--valid-data");
  std::vector<ZeroShotSample> samples;
  std::istringstream lines(content);
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (python_strip(line).empty()) continue;
    const std::string where = str(file.string(), ":", number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      MG_THROW(where, ": not a JSON object (", e.what(), "); LAMBADA lines are {\"text\": ...}");
    }
    MG_REQUIRE(j.is_object() && j.contains("text") && j["text"].is_string(), where,
               ": no \"text\" string; LAMBADA lines are {\"text\": ...}");
    const std::string text = j["text"].get<std::string>();
    std::vector<int32_t> context, targets;
    if (!strict) {
      context = tokenizer.encode(text);
      MG_REQUIRE(!context.empty(), where, ": the text has no tokens");
      targets.push_back(context.back());
      context.pop_back();
    } else {
      const std::vector<std::string> words = python_split(text);
      MG_REQUIRE(!words.empty(), where, ": the text has no words");
      const size_t start = text.rfind(words.back());
      context = tokenizer.encode(python_strip(text.substr(0, start)));
      targets = tokenizer.encode(" " + words.back());
    }
    ZeroShotSample s;
    s.tokens = context;
    s.tokens.insert(s.tokens.end(), targets.begin(), targets.end());
    MG_REQUIRE(int64_t(s.tokens.size()) <= seq_length + 1, where, ": ", s.tokens.size(),
               " tokens, more than --seq-length + 1 = ", seq_length + 1);
    // Megatron's pad_mask [0] * context + [1] * targets, shifted to the label positions.
    for (size_t i = 1; i < s.tokens.size(); ++i) s.loss_mask.push_back(i >= context.size() ? 1 : 0);
    samples.push_back(std::move(s));
  }
  return samples;
}

LMWindows::LMWindows(std::vector<int32_t> tokens, int64_t seq_length, int32_t pad_id,
                     int64_t overlapping_eval, int64_t num_original_tokens)
    : tokens_(std::move(tokens)),
      seq_length_(seq_length),
      overlapping_eval_(std::max<int64_t>(1, overlapping_eval)),
      num_original_tokens_(num_original_tokens),
      pad_id_(pad_id) {
  MG_REQUIRE(seq_length_ >= 1, "--seq-length must be >= 1 (got ", seq_length_, ")");
  const int64_t targets = std::max<int64_t>(int64_t(tokens_.size()) - 1 - overlapping_eval_, 0);
  num_windows_ = std::max<int64_t>((targets + overlapping_eval_ - 1) / overlapping_eval_ + 1, 1);
}

ZeroShotSample LMWindows::get(int64_t index) const {
  MG_CHECK(index >= 0 && index < num_windows_, "window ", index, " of ", num_windows_);
  const int64_t start = std::min<int64_t>(index * overlapping_eval_, int64_t(tokens_.size()));
  const int64_t end = std::min<int64_t>(start + seq_length_ + 1, int64_t(tokens_.size()));
  ZeroShotSample s;
  s.tokens.assign(tokens_.begin() + start, tokens_.begin() + end);
  std::vector<uint8_t> pad_mask(s.tokens.size(), 1);
  pad_mask.resize(size_t(seq_length_ + 1), 0);
  s.tokens.resize(size_t(seq_length_ + 1), pad_id_);
  s.loss_mask.assign(pad_mask.begin() + 1, pad_mask.end());
  // After the first window only the last overlapping_eval targets are new.
  if (overlapping_eval_ != seq_length_ && index != 0) {
    const int64_t keep = std::min<int64_t>(overlapping_eval_, int64_t(s.loss_mask.size()));
    std::fill(s.loss_mask.begin(), s.loss_mask.end() - keep, 0);
  }
  return s;
}

LMWindows build_wikitext_windows(const std::filesystem::path& file, const data::Tokenizer& tokenizer,
                                 int64_t seq_length, int64_t overlapping_eval,
                                 std::optional<Detokenizer> detokenizer) {
  const std::string text = read_file(file, "--valid-data");
  size_t bad = 0;
  MG_REQUIRE(valid_utf8(text, &bad), file.string(), ": not UTF-8 text (byte ", bad, ")");
  if (!detokenizer) detokenizer = detokenizer_for_path(file.string());
  MG_REQUIRE(detokenizer.has_value(), file.string(), ": its name contains none of ptb, wiki, "
             "lambada, which choose Megatron's detokenizer");
  // len(text.strip().split(" ")): the words between single spaces.
  const std::string stripped = python_strip(text);
  const int64_t original = int64_t(std::count(stripped.begin(), stripped.end(), ' ')) + 1;
  std::vector<int32_t> tokens = tokenizer.encode(detokenize(*detokenizer, text));
  MG_REQUIRE(tokens.size() >= 2 && original >= 2, file.string(), ": too short to evaluate (",
             original, " words, ", tokens.size(), " tokens)");
  return LMWindows(std::move(tokens), seq_length, tokenizer.eod_or_throw(), overlapping_eval,
                   original);
}

ZeroShotTotals score_samples(LanguageModel& model, int64_t count,
                             const std::function<ZeroShotSample(int64_t)>& sample,
                             const ZeroShotOptions& options) {
  MG_REQUIRE(options.micro_batch_size >= 1, "--micro-batch-size must be >= 1");
  const int64_t V = model.vocab_size();
  ZeroShotTotals totals;
  for (int64_t begin = 0, iteration = 0; begin < count; begin += options.micro_batch_size, ++iteration) {
    if (options.progress) options.progress(iteration, begin, count);
    std::vector<ZeroShotSample> rows;
    for (int64_t i = begin; i < std::min(count, begin + options.micro_batch_size); ++i)
      rows.push_back(sample(i));
    const int64_t b = int64_t(rows.size());
    // Positions [first, n) hold every scored label of the batch; later inputs change nothing.
    int64_t first = std::numeric_limits<int64_t>::max(), n = 0;
    for (const auto& r : rows)
      for (int64_t p = 0; p < int64_t(r.loss_mask.size()); ++p)
        if (r.loss_mask[size_t(p)]) first = std::min(first, p), n = std::max(n, p + 1);
    std::vector<uint8_t> correct(size_t(b), 1);
    totals.samples += b;
    if (n == 0) {  // nothing scored: correct by Megatron's product over no positions
      totals.correct += b;
      continue;
    }
    MG_REQUIRE(n <= model.max_sequence_length(), "a sample needs ", n, " positions, more than the "
               "model's ", model.max_sequence_length(), " (--max-position-embeddings)");
    std::vector<int32_t> inputs(size_t(b * n), options.pad_id);
    for (int64_t r = 0; r < b; ++r) {
      const auto& t = rows[size_t(r)].tokens;
      std::copy(t.begin(), t.begin() + std::min<int64_t>(n, int64_t(t.size()) - 1),
                inputs.begin() + r * n);
    }
    auto slice = [&](int64_t from, int64_t len) {
      std::vector<int32_t> out(size_t(b * len));
      for (int64_t r = 0; r < b; ++r)
        std::copy_n(inputs.begin() + r * n + from, len, out.begin() + r * len);
      return out;
    };
    model.start(b, n);
    if (first > 0) model.forward(slice(0, first), first, false);
    // Logits for at most ~64 MiB at a time.
    const int64_t chunk = std::max<int64_t>(1, (int64_t(64) << 20) / (4 * b * V));
    for (int64_t from = first; from < n; from += chunk) {
      const int64_t len = std::min(chunk, n - from);
      const Tensor logits = model.forward(slice(from, len), len, true);
      MG_CHECK(logits.numel() == b * len * V, "logits of ", logits.numel(), " values, expected ",
               b * len * V);
      const float* z = logits.data<float>();
      for (int64_t r = 0; r < b; ++r) {
        const auto& row = rows[size_t(r)];
        for (int64_t k = 0; k < len; ++k) {
          const int64_t p = from + k;
          if (p >= int64_t(row.loss_mask.size()) || !row.loss_mask[size_t(p)]) continue;
          const float* x = z + (r * len + k) * V;
          const int32_t label = row.tokens[size_t(p + 1)];
          MG_REQUIRE(label >= 0 && label < V, "token id ", label, " is outside the model's vocabulary of ", V);
          const int64_t argmax = std::max_element(x, x + V) - x;
          double sum = 0;
          const double top = x[argmax];
          for (int64_t v = 0; v < V; ++v) sum += std::exp(double(x[v]) - top);
          totals.loss_sum += top + std::log(sum) - double(x[label]);
          ++totals.scored;
          if (argmax != label) correct[size_t(r)] = 0;
        }
      }
    }
    totals.correct += std::count(correct.begin(), correct.end(), uint8_t(1));
  }
  return totals;
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  // Python writes exponents as e-05 / e+16 and always shows a fraction or an exponent.
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    const char sign = exp[0] == '-' ? '-' : '+';
    if (exp[0] == '-' || exp[0] == '+') exp = exp.substr(1);
    if (exp.size() < 2) exp = "0" + exp;
    const double magnitude = std::abs(v);
    if (magnitude >= 1e-4 && magnitude < 1e16) {  // Python uses the fixed form in this range
      char fixed[400];
      std::to_chars_result r = std::to_chars(fixed, fixed + sizeof fixed, v, std::chars_format::fixed);
      s.assign(fixed, r.ptr);
      if (s.find('.') == std::string::npos) s += ".0";
      return s;
    }
    return mant + "e" + sign + exp;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string lambada_result_line(const std::string& task, int64_t correct, int64_t total) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                " validation results on %s | number correct: %.4E | total examples: %.4E | avg "
                "accuracy: %.4E",
                task.c_str(), double(correct), double(total),
                total > 0 ? double(correct) / double(total) : std::nan(""));
  return buf;
}

std::string wikitext_result_line(const std::string& task, double loss_sum,
                                 int64_t num_tokenized_tokens, int64_t num_original_tokens) {
  const double val_loss = loss_sum / double(num_tokenized_tokens - 1);
  const double ppl = std::exp(std::min(20.0, val_loss));
  const double token_ratio = double(num_tokenized_tokens - 1) / double(num_original_tokens - 1);
  const double adjusted_ppl = std::exp(std::min(20.0, val_loss * token_ratio));
  char buf[256];
  std::snprintf(buf, sizeof buf,
                " validation results on %s | avg loss: %.4E | ppl: %.4E | adjusted ppl: %.4E | "
                "token ratio: %s |",
                task.c_str(), val_loss, ppl, adjusted_ppl, python_float_repr(token_ratio).c_str());
  return buf;
}

}  // namespace megatron::inference
