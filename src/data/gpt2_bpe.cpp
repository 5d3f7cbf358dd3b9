// GPT-2 byte-level BPE; see gpt2_bpe.h for the exact semantics.
#include "data/gpt2_bpe.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/input_bounds.h"
#include "data/unicode.h"

namespace megatron::data {
namespace {

using unicode::CharClass;

std::string read_whole_file(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  MG_REQUIRE(f.good(), "cannot open ", flag, " '", path, "' (check the path)");
  std::ostringstream ss;
  ss << f.rdbuf();
  MG_REQUIRE(!f.bad(), "error reading ", flag, " '", path, "'");
  return ss.str();
}

// GPT-2's bytes_to_unicode, inverted: code point of a vocab character -> byte (-1: none).
std::vector<int> unicode_to_byte() {
  std::vector<int> inv(512, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : 256 + extra++;
    inv[cp] = b;
  }
  return inv;
}

// Vocab/merge token text (byte-to-unicode form) -> raw bytes; nullopt if a character is not
// one of the 256 byte characters.
std::optional<std::string> token_to_bytes(std::string_view s, const std::vector<int>& inv) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    int len;
    int32_t cp = unicode::decode_utf8(s, i, len);
    if (cp < 0 || cp >= int32_t(inv.size()) || inv[cp] < 0) return std::nullopt;
    out += char(inv[cp]);
    i += len;
  }
  return out;
}

size_t line_of_offset(const std::string& text, size_t offset) {
  size_t line = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

// Calls f(piece) for each piece of GPT-2's pre-tokenization regex (see gpt2_bpe.h).
template <class F>
void for_each_piece(std::string_view t, F&& f) {
  const size_t n = t.size();
  size_t i = 0;
  auto cls_at = [&](size_t k, int& len) {
    return unicode::char_class(unicode::decode_utf8(t, k, len));
  };
  while (i < n) {
    const size_t start = i;
    const char c = t[i];
    if (c == '\'' && i + 1 < n) {
      const char a = t[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        f(t.substr(i, 2));
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        const char b = t[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          f(t.substr(i, 3));
          i += 3;
          continue;
        }
      }
    }
    int len;
    CharClass cls = cls_at(i, len);
    size_t j = i + len;
    if (c == ' ' && j < n) {
      int len2;
      CharClass next = cls_at(j, len2);
      if (next != CharClass::kSpace) {  // " ?\p{L}+", " ?\p{N}+" or " ?[^\s\p{L}\p{N}]+"
        cls = next;
        j += len2;
      }
    }
    if (cls != CharClass::kSpace) {
      while (j < n) {
        int l;
        if (cls_at(j, l) != cls) break;
        j += l;
      }
      f(t.substr(start, j - start));
      i = j;
      continue;
    }
    // Whitespace run [start, j): "\s+(?!\S)" takes all of it at the end of the text, else all
    // but its last character (if that leaves at least one); "\s+" takes a single one.
    size_t last = start;
    while (j < n) {
      int l;
      if (cls_at(j, l) != CharClass::kSpace) break;
      last = j;
      j += l;
    }
    if (j < n && last > start) j = last;
    f(t.substr(start, j - start));
    i = j;
  }
}

std::atomic<uint64_t> g_next_instance{1};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

// Per-thread cache of piece -> ids, valid for one tokenizer instance at a time.
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
};
constexpr size_t kMaxCacheEntries = size_t(1) << 18;
// Pieces longer than this (bytes) merge with the heap-based merge_long.
constexpr size_t kLongPiece = 64;
// Largest token id accepted (ids index a table; no byte-level BPE vocabulary comes close).
constexpr int64_t kMaxTokenId = int64_t(1) << 24;

}  // namespace

// Open-addressing hash map (id_a, id_b) -> (rank, merged id).
struct GPT2BPETokenizer::MergeTable {
  struct Slot {
    uint64_t key = ~uint64_t(0);
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t key_of(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  static uint64_t hash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) ^ (k >> 29); }

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  void put(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t k = key_of(a, b);
    for (uint64_t h = hash(k) & mask;; h = (h + 1) & mask) {
      if (slots[h].key == k || slots[h].key == ~uint64_t(0)) {
        slots[h] = {k, rank, merged};  // a repeated merge takes the later rank, like GPT-2's dict
        return;
      }
    }
  }
  const Slot* find(int32_t a, int32_t b) const {
    uint64_t k = key_of(a, b);
    for (uint64_t h = hash(k) & mask;; h = (h + 1) & mask) {
      if (slots[h].key == k) return &slots[h];
      if (slots[h].key == ~uint64_t(0)) return nullptr;
    }
  }
};

// A token's bytes for messages: printable ASCII as is, other bytes as \xNN.
static std::string printable_token(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes.substr(0, 32)) {
    if (c >= 0x20 && c < 0x7f) out.push_back(char(c));
    else out += {'\\', 'x', "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]};
  }
  return out;
}

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) try
    : instance_(g_next_instance.fetch_add(1)) {
  const std::vector<int> inv = unicode_to_byte();

  // --- encoder JSON: {"token": id, ...}
  const std::string vocab_text = read_whole_file(vocab_file, "--vocab-file");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::parse_error& e) {
    MG_THROW("--vocab-file '", vocab_file, "' line ", line_of_offset(vocab_text, e.byte),
             ": not valid JSON (", e.what(), "); GPT2BPETokenizer needs GPT-2's encoder.json");
  }
  MG_REQUIRE(vocab.is_object() && !vocab.empty(), "--vocab-file '", vocab_file,
             "' must be a JSON object mapping token strings to ids (GPT-2's encoder.json)");
  std::unordered_map<std::string, int32_t> bytes_to_id;
  bytes_to_id.reserve(vocab.size() * 2);
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto& v = it.value();
    MG_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxTokenId,
               "--vocab-file '", vocab_file, "': token '", it.key(),
               "' must map to an integer id in [0, 2^24), got ", v.dump());
    auto bytes = token_to_bytes(it.key(), inv);
    MG_REQUIRE(bytes.has_value() && !bytes->empty(), "--vocab-file '", vocab_file, "': token '",
               it.key(), "' is not in GPT-2's byte-to-unicode alphabet");
    int32_t id = int32_t(v.get<int64_t>());
    max_id = std::max(max_id, id);
    bytes_to_id[*bytes] = id;
  }
  vocab_size_ = int64_t(vocab.size());
  id_bytes_.assign(size_t(max_id) + 1, std::string());
  has_id_.assign(size_t(max_id) + 1, false);
  for (const auto& [bytes, id] : bytes_to_id) {
    MG_REQUIRE(!has_id_[id], "--vocab-file '", vocab_file, "': id ", id, " is used by two tokens");
    has_id_[id] = true;
    id_bytes_[id] = bytes;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string(1, char(b)));
    MG_REQUIRE(it != bytes_to_id.end(), "--vocab-file '", vocab_file, "' has no token for byte 0x",
               "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15],
               "; a byte-level BPE vocabulary needs all 256 byte tokens");
    byte_id_[b] = it->second;
  }
  if (auto it = vocab.find("<|endoftext|>"); it != vocab.end()) eod_ = int32_t(it->get<int64_t>());

  // --- merges: optional "#version" first line, then "left right" per line, rank = order.
  const std::string merge_text = read_whole_file(merge_file, "--merge-file");
  std::vector<std::array<int32_t, 3>> merges;  // left, right, merged
  std::unordered_map<uint64_t, size_t> line_of_pair;  // (left, right) -> its line
  size_t line_no = 0;
  for (size_t pos = 0; pos < merge_text.size();) {
    size_t end = merge_text.find('\n', pos);
    if (end == std::string::npos) end = merge_text.size();
    std::string_view line(merge_text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ');
    MG_REQUIRE(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string_view::npos,
               "--merge-file '", merge_file, "' line ", line_no,
               ": expected two tokens separated by one space, got '", line, "'");
    std::string_view parts[2] = {line.substr(0, sp), line.substr(sp + 1)};
    std::array<int32_t, 3> m{};
    std::string joined;
    for (int k = 0; k < 2; ++k) {
      auto bytes = token_to_bytes(parts[k], inv);
      MG_REQUIRE(bytes.has_value(), "--merge-file '", merge_file, "' line ", line_no, ": token '",
                 parts[k], "' is not in GPT-2's byte-to-unicode alphabet");
      auto it = bytes_to_id.find(*bytes);
      MG_REQUIRE(it != bytes_to_id.end(), "--merge-file '", merge_file, "' line ", line_no,
                 ": token '", parts[k], "' is not in --vocab-file '", vocab_file,
                 "' (do the two files belong together?)");
      m[k] = it->second;
      joined += *bytes;
    }
    auto it = bytes_to_id.find(joined);
    MG_REQUIRE(it != bytes_to_id.end(), "--merge-file '", merge_file, "' line ", line_no,
               ": the merged token '", parts[0], parts[1], "' is not in --vocab-file '", vocab_file,
               "' (do the two files belong together?)");
    m[2] = it->second;
    // A repeated line would move the pair to its later rank (GPT-2's dict keeps the last): the
    // file was damaged or edited by hand.
    const auto [first, fresh] =
        line_of_pair.emplace((uint64_t(uint32_t(m[0])) << 32) | uint32_t(m[1]), line_no);
    MG_REQUIRE(fresh, "--merge-file '", merge_file, "' line ", line_no, ": '", line,
               "' repeats line ", first->second, "; each merge appears once (a repeated line "
               "changes the merge ranks): use the model's original merges file");
    merges.push_back(m);
  }
  check_merges_cover_vocabulary(merges, merge_file, vocab_file);
  merges_ = std::make_unique<MergeTable>(merges.size());
  for (size_t r = 0; r < merges.size(); ++r)
    merges_->put(merges[r][0], merges[r][1], uint32_t(r), merges[r][2]);
} MG_CATCH_OUT_OF_MEMORY("--vocab-file '" + vocab_file + "' / --merge-file '" + merge_file + "'")

// A byte-level BPE vocabulary is the 256 byte tokens, one token per merge, and special tokens:
// every other token must be made by a merge whose two parts exist by then (bytes or earlier
// merges). A merges file missing lines (empty, cut short, from another vocabulary) leaves tokens
// that encode can never produce, and text then splits into several times as many tokens; that
// is refused here, naming a few of the tokens. Special tokens ("<|endoftext|>", "<s>", "<pad>",
// ...: text in angle brackets) are exempt.
void GPT2BPETokenizer::check_merges_cover_vocabulary(const std::vector<std::array<int32_t, 3>>& merges,
                                                     const std::string& merge_file,
                                                     const std::string& vocab_file) const {
  std::vector<bool> made(has_id_.size(), false);
  for (int b = 0; b < 256; ++b) made[size_t(byte_id_[b])] = true;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& m = merges[r];
    MG_REQUIRE(made[size_t(m[0])] && made[size_t(m[1])], "--merge-file '", merge_file, "': merge ",
               r + 1, " ('", printable_token(id_bytes_[size_t(m[0])]), "' + '",
               printable_token(id_bytes_[size_t(m[1])]), "') uses a token that no earlier merge "
               "makes: the lines are out of order or some are missing");
    made[size_t(m[2])] = true;
  }
  std::vector<std::string> unreachable;
  size_t count = 0;
  for (size_t id = 0; id < has_id_.size(); ++id) {
    if (!has_id_[id] || made[id]) continue;
    const std::string& t = id_bytes_[id];
    if (t.size() >= 3 && t.front() == '<' && t.back() == '>') continue;  // a special token
    ++count;
    if (unreachable.size() < 5) unreachable.push_back("'" + printable_token(t) + "'");
  }
  if (count == 0) return;
  std::string examples;
  for (const auto& u : unreachable) examples += (examples.empty() ? "" : ", ") + u;
  MG_THROW("--merge-file '", merge_file, "' has ", merges.size(), " merges, but ", count,
           " tokens of --vocab-file '", vocab_file, "' are made by none of them (", examples,
           count > unreachable.size() ? ", ..." : "", "): the merges file is incomplete (empty or "
           "cut short?) or belongs to another vocabulary; text would split into far more tokens");
}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

// GPT-2's bpe(): each round finds the lowest-rank adjacent pair and merges all its occurrences
// left to right. O(n^2) in the piece length, fastest for ordinary words.
std::vector<int32_t> GPT2BPETokenizer::merge_short(std::string_view piece) const {
  std::vector<int32_t> sym(piece.size());
  for (size_t k = 0; k < piece.size(); ++k) sym[k] = byte_id_[uint8_t(piece[k])];
  while (sym.size() > 1) {
    uint32_t best = UINT32_MAX;
    int32_t a = 0, b = 0, merged = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      const MergeTable::Slot* s = merges_->find(sym[k], sym[k + 1]);
      if (s && s->rank < best) {
        best = s->rank;
        a = sym[k];
        b = sym[k + 1];
        merged = s->merged;
      }
    }
    if (best == UINT32_MAX) break;
    size_t w = 0;
    for (size_t k = 0; k < sym.size();) {
      if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) {
        sym[w++] = merged;
        k += 2;
      } else {
        sym[w++] = sym[k++];
      }
    }
    sym.resize(w);
  }
  return sym;
}

// The same merges in O(n log n) for long pieces (no-space runs of code, base64, ...): a heap of
// candidate pairs ordered by (rank, position) over a linked list of symbols. Popping equal ranks
// left to right reproduces merge_short's "all occurrences, left to right" rounds whenever a
// merge's parts are created by earlier merges (true of every trained merges file).
std::vector<int32_t> GPT2BPETokenizer::merge_long(std::string_view piece) const {
  const int32_t n = int32_t(piece.size());
  std::vector<int32_t> id(n), next(n), prev(n);
  for (int32_t k = 0; k < n; ++k) {
    id[k] = byte_id_[uint8_t(piece[k])];
    next[k] = k + 1 < n ? k + 1 : -1;
    prev[k] = k - 1;
  }
  struct Cand {
    uint32_t rank;
    int32_t pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const MergeTable::Slot* s = merges_->find(id[pos], id[next[pos]]))
      heap.push({s->rank, pos, id[pos], id[next[pos]]});
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    const int32_t r = next[c.pos];
    if (!alive[c.pos] || r < 0 || id[c.pos] != c.left || id[r] != c.right) continue;  // stale
    id[c.pos] = merges_->find(c.left, c.right)->merged;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::vector<int32_t> sym;
  for (int32_t k = 0; k >= 0; k = next[k]) sym.push_back(id[k]);
  return sym;
}

void GPT2BPETokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[uint8_t(piece[0])]);
    return;
  }
  thread_local PieceCache cache;
  if (cache.owner != instance_) {
    cache.map.clear();
    cache.owner = instance_;
  }
  if (auto it = cache.map.find(piece); it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> sym = piece.size() > kLongPiece ? merge_long(piece) : merge_short(piece);
  out.insert(out.end(), sym.begin(), sym.end());
  if (piece.size() > kLongPiece) return;  // rare; not worth the memory
  if (cache.map.size() >= kMaxCacheEntries) cache.map.clear();
  cache.map.emplace(std::string(piece), std::move(sym));
}

void GPT2BPETokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  for_each_piece(text, [&](std::string_view piece) { bpe(piece, out); });
}

std::vector<std::string_view> GPT2BPETokenizer::pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for_each_piece(text, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

const std::string& GPT2BPETokenizer::token_bytes(int32_t id) const {
  MG_REQUIRE(id >= 0 && size_t(id) < id_bytes_.size() && has_id_[id], "GPT2BPETokenizer: token id ",
             id, " is not in the vocabulary (size ", vocab_size_, ")");
  return id_bytes_[id];
}

std::string GPT2BPETokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);
  return unicode::repair_utf8(bytes);
}

}  // namespace megatron::data
