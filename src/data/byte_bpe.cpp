// Byte-level BPE engine; see byte_bpe.h for the two merge rules.
#include "data/byte_bpe.h"

#include <atomic>
#include <queue>

#include "core/error.h"

namespace megatron::data {

namespace {

std::atomic<uint64_t> g_next_instance{1};

// Per-thread cache of piece -> ids, valid for one engine instance at a time.
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, TransparentStringHash, std::equal_to<>> map;
};
constexpr size_t kMaxCacheEntries = size_t(1) << 18;
constexpr size_t kLongPiece = 64;
constexpr uint32_t kNoRank = UINT32_MAX;

}  // namespace

// Open-addressing hash map (left id, right id) -> (rank, merged id).
struct ByteBPE::PairTable {
  struct Slot {
    uint64_t key = ~uint64_t(0);
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t key_of(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static uint64_t hash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) ^ (k >> 29); }

  explicit PairTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  // The first rank of a repeated pair wins (the tokenizers crate keeps the first).
  void put(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    const uint64_t k = key_of(a, b);
    for (uint64_t h = hash(k) & mask;; h = (h + 1) & mask) {
      if (slots[h].key == k) return;
      if (slots[h].key == ~uint64_t(0)) {
        slots[h] = {k, rank, merged};
        return;
      }
    }
  }
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t k = key_of(a, b);
    for (uint64_t h = hash(k) & mask;; h = (h + 1) & mask) {
      if (slots[h].key == k) return &slots[h];
      if (slots[h].key == ~uint64_t(0)) return nullptr;
    }
  }
};

ByteBPE::ByteBPE() : instance_(g_next_instance.fetch_add(1)) {}
ByteBPE::~ByteBPE() = default;

std::unique_ptr<ByteBPE> ByteBPE::from_ranks(std::vector<std::string> token_bytes,
                                             int32_t id_offset) {
  std::unique_ptr<ByteBPE> e(new ByteBPE());
  e->ranks_ = true;
  e->whole_piece_first_ = true;
  e->id_offset_ = id_offset;
  e->token_id_.reserve(token_bytes.size() * 2);
  for (size_t r = 0; r < token_bytes.size(); ++r)
    e->token_id_.emplace(std::move(token_bytes[r]), int32_t(r) + id_offset);
  for (int b = 0; b < 256; ++b) {
    auto id = e->token_id(std::string_view(reinterpret_cast<const char*>(&b), 1));
    MG_CHECK(id.has_value(), "byte-level ranks lack byte ", b);
    e->byte_id_[b] = *id;
  }
  return e;
}

std::unique_ptr<ByteBPE> ByteBPE::from_merges(BytesToId vocab,
                                              const std::vector<std::pair<int32_t, int32_t>>& merges,
                                              bool ignore_merges) {
  std::unique_ptr<ByteBPE> e(new ByteBPE());
  e->ranks_ = false;
  e->whole_piece_first_ = ignore_merges;
  e->token_id_ = std::move(vocab);
  std::vector<const std::string*> bytes_of;
  for (const auto& [bytes, id] : e->token_id_) {
    if (size_t(id) >= bytes_of.size()) bytes_of.resize(size_t(id) + 1, nullptr);
    bytes_of[size_t(id)] = &bytes;
  }
  e->merges_ = std::make_unique<PairTable>(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = merges[r];
    MG_CHECK(size_t(a) < bytes_of.size() && size_t(b) < bytes_of.size() && bytes_of[a] && bytes_of[b],
             "merge ", r, " names unknown ids");
    auto merged = e->token_id(*bytes_of[a] + *bytes_of[b]);
    MG_CHECK(merged.has_value(), "merge ", r, " makes a token outside the vocabulary");
    e->merges_->put(a, b, uint32_t(r), *merged);
  }
  for (int b = 0; b < 256; ++b) {
    auto id = e->token_id(std::string_view(reinterpret_cast<const char*>(&b), 1));
    MG_CHECK(id.has_value(), "byte-level vocabulary lacks byte ", b);
    e->byte_id_[b] = *id;
  }
  return e;
}

std::optional<int32_t> ByteBPE::token_id(std::string_view bytes) const {
  auto it = token_id_.find(bytes);
  if (it == token_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<ByteBPE::Found> ByteBPE::pair(std::string_view piece, const Sym& a,
                                            const Sym& b) const {
  if (ranks_) {
    auto it = token_id_.find(piece.substr(a.start, b.end - a.start));
    if (it == token_id_.end()) return std::nullopt;
    return Found{uint32_t(it->second - id_offset_), it->second};
  }
  const PairTable::Slot* s = merges_->find(a.id, b.id);
  if (!s) return std::nullopt;
  return Found{s->rank, s->merged};
}

// tiktoken's byte_pair_merge: keep the rank of each adjacent pair; merge the lowest (leftmost on
// a tie) and recompute only the two pairs around it.
void ByteBPE::merge_short(std::string_view piece, std::vector<Sym>& sym) const {
  std::vector<uint32_t> rank(sym.size(), kNoRank);
  std::vector<int32_t> merged(sym.size(), -1);
  auto eval = [&](size_t i) {
    if (i + 1 >= sym.size()) {
      rank[i] = kNoRank;
      return;
    }
    auto f = pair(piece, sym[i], sym[i + 1]);
    rank[i] = f ? f->rank : kNoRank;
    merged[i] = f ? f->id : -1;
  };
  for (size_t i = 0; i < sym.size(); ++i) eval(i);
  while (sym.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < sym.size(); ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNoRank) break;
    sym[best] = {sym[best].start, sym[best + 1].end, merged[best]};
    sym.erase(sym.begin() + long(best) + 1);
    rank.erase(rank.begin() + long(best) + 1);
    merged.erase(merged.begin() + long(best) + 1);
    eval(best);
    if (best > 0) eval(best - 1);
  }
}

// The same merges with a heap of candidate pairs ordered by (rank, position). A candidate is
// stale once either of its symbols changed, which shows in the symbol boundaries.
void ByteBPE::merge_long(std::string_view piece, std::vector<Sym>& sym) const {
  const int32_t n = int32_t(sym.size());
  std::vector<int32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (int32_t k = 0; k < n; ++k) {
    next[k] = k + 1 < n ? k + 1 : -1;
    prev[k] = k - 1;
  }
  struct Cand {
    uint32_t rank;
    int32_t pos;
    uint32_t right_end;
    int32_t merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t k) {
    if (k < 0 || next[k] < 0) return;
    if (auto f = pair(piece, sym[k], sym[next[k]])) heap.push({f->rank, k, sym[next[k]].end, f->id});
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int32_t r = next[c.pos];
    if (!alive[c.pos] || r < 0 || sym[r].end != c.right_end) continue;
    sym[c.pos] = {sym[c.pos].start, sym[r].end, c.merged};
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::vector<Sym> out;
  for (int32_t k = 0; k >= 0; k = next[k]) out.push_back(sym[k]);
  sym.swap(out);
}

void ByteBPE::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
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
  std::vector<int32_t> ids;
  if (whole_piece_first_) {
    if (auto id = token_id(piece)) ids.push_back(*id);
  }
  if (ids.empty()) {
    std::vector<Sym> sym(piece.size());
    for (uint32_t k = 0; k < piece.size(); ++k) sym[k] = {k, k + 1, byte_id_[uint8_t(piece[k])]};
    if (piece.size() > kLongPiece)
      merge_long(piece, sym);
    else
      merge_short(piece, sym);
    ids.reserve(sym.size());
    for (const Sym& s : sym) ids.push_back(s.id);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (piece.size() > kLongPiece) return;  // rare; not worth the memory
  if (cache.map.size() >= kMaxCacheEntries) cache.map.clear();
  cache.map.emplace(std::string(piece), std::move(ids));
}

}  // namespace megatron::data
