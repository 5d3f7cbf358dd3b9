// The restricted unpickler's opcode interpreter (see pickle.h); what the known globals mean is in
// pickle_globals.cpp.
#include <bit>
#include <unordered_map>

#include "core/error.h"
#include "core/pickle_internal.h"

namespace megatron::pickle {

namespace {

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> in, const std::string& label) : in_(in), label_(label) {}
  void allow_distcp_classes(bool on) { doc_.distcp_classes = on; }

  Document run(size_t* consumed) {
    while (true) {
      const size_t at = pos_;
      const uint8_t op = byte();
      if (op == '.') {  // STOP
        MG_REQUIRE(stack_.size() > base(), where(at), "STOP with an empty stack");
        doc_.root = stack_.back();
        if (consumed != nullptr) *consumed = pos_;
        return std::move(doc_);
      }
      step(op, at);
    }
  }

 private:
  std::string where(size_t at) const { return str(label_, ": pickle opcode at byte ", at, ": "); }

  void need(uint64_t n) const {
    MG_REQUIRE(n <= in_.size() - pos_, label_, ": the pickle ends early (", in_.size() - pos_,
               " bytes left at byte ", pos_, ", ", n, " needed): truncated or corrupted file");
  }
  uint8_t byte() {
    need(1);
    return in_[pos_++];
  }
  uint64_t le(int n) {
    need(uint64_t(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(in_[pos_ + size_t(i)]) << (8 * i);
    pos_ += size_t(n);
    return v;
  }
  std::string bytes(uint64_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  std::string line() {  // GLOBAL's module and name: up to a newline, at most 256 bytes
    std::string s;
    while (true) {
      const uint8_t c = byte();
      if (c == '\n') return s;
      MG_REQUIRE(s.size() < 256, label_, ": an over-long global name near byte ", pos_,
                 " (corrupted pickle)");
      s.push_back(char(c));
    }
  }

  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Value* v) {
    MG_REQUIRE(stack_.size() < kMaxPickleObjects, label_, ": the pickle's stack passes ",
               kMaxPickleObjects, " entries (corrupted file)");
    stack_.push_back(v);
  }
  void memo_put(uint64_t i, Value* v) {
    MG_REQUIRE(memo_.size() < kMaxPickleObjects || memo_.count(i), label_, ": the pickle's memo passes ",
               kMaxPickleObjects, " entries (corrupted file)");
    memo_[i] = v;
  }
  Value* pop(size_t at) {
    MG_REQUIRE(stack_.size() > base(), where(at), "pops an empty stack (corrupted pickle)");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top(size_t at) {
    MG_REQUIRE(stack_.size() > base(), where(at), "reads an empty stack (corrupted pickle)");
    return stack_.back();
  }
  std::vector<Value*> pop_mark(size_t at) {
    MG_REQUIRE(!marks_.empty(), where(at), "no MARK to pop to (corrupted pickle)");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + std::ptrdiff_t(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Value* memo_get(uint64_t i, size_t at) {
    auto it = memo_.find(i);
    MG_REQUIRE(it != memo_.end(), where(at), "memo entry ", i, " was never stored (corrupted pickle)");
    return it->second;
  }
  Value* integer(int64_t i) { return doc_.integer(i); }
  Value* long_int(const std::string& le_bytes) {
    if (le_bytes.size() <= 8) {
      uint64_t u = 0;
      for (size_t i = 0; i < le_bytes.size(); ++i) u |= uint64_t(uint8_t(le_bytes[i])) << (8 * i);
      if (!le_bytes.empty() && le_bytes.size() < 8 && (uint8_t(le_bytes.back()) & 0x80))
        u |= ~uint64_t(0) << (8 * le_bytes.size());  // sign extension
      return integer(int64_t(u));
    }
    Value* v = doc_.make(Kind::BigInt);
    v->text = le_bytes;
    return v;
  }

  void step(uint8_t op, size_t at);
  Value* global(const std::string& module, const std::string& name, size_t at) {
    return detail::make_global(doc_, module, name, where(at));
  }
  Value* call(Value* f, Value* args, size_t at) { return detail::call_global(doc_, f, args, where(at)); }
  Value* newobj(Value* cls, Value* args, size_t at) {
    return detail::new_object(doc_, cls, args, where(at));
  }
  void build(Value* obj, Value* state, size_t at) { detail::build_object(obj, state, where(at)); }
  Value* persistent(Value* pid, size_t at) { return detail::storage_reference(doc_, pid, where(at)); }

  std::span<const uint8_t> in_;
  const std::string& label_;
  size_t pos_ = 0;
  Document doc_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
};

void Unpickler::step(uint8_t op, size_t at) {
  switch (op) {
    case 0x80: {  // PROTO
      const uint8_t p = byte();
      MG_REQUIRE(p <= 5, where(at), "pickle protocol ", int(p), " is newer than any known (5)");
      return;
    }
    case 0x95: le(8); return;  // FRAME: a length hint only
    case '(':
      MG_REQUIRE(marks_.size() < kMaxPickleObjects, where(at), "too many MARKs (corrupted file)");
      marks_.push_back(stack_.size());
      return;
    case '0': {  // POP (or the mark itself when nothing is above it, as CPython does)
      if (stack_.size() > base()) stack_.pop_back();
      else if (!marks_.empty()) marks_.pop_back();
      else MG_THROW(where(at), "POP on an empty stack (corrupted pickle)");
      return;
    }
    case '1': pop_mark(at); return;  // POP_MARK
    case '2': push(top(at)); return;  // DUP
    case 'N': push(doc_.none()); return;
    case 0x88: push(doc_.boolean(true)); return;
    case 0x89: push(doc_.boolean(false)); return;
    case 'J': push(integer(int64_t(int32_t(uint32_t(le(4)))))); return;  // BININT
    case 'K': push(integer(int64_t(le(1)))); return;                    // BININT1
    case 'M': push(integer(int64_t(le(2)))); return;                    // BININT2
    case 0x8a: push(long_int(bytes(le(1)))); return;                    // LONG1
    case 0x8b: {                                                        // LONG4
      const int64_t n = int32_t(uint32_t(le(4)));
      MG_REQUIRE(n >= 0, where(at), "negative LONG4 length");
      push(long_int(bytes(uint64_t(n))));
      return;
    }
    case 'G': {  // BINFLOAT: big-endian IEEE double
      need(8);
      uint64_t u = 0;
      for (int i = 0; i < 8; ++i) u = (u << 8) | in_[pos_ + size_t(i)];
      pos_ += 8;
      push(doc_.real(std::bit_cast<double>(u)));
      return;
    }
    case 'X': push(doc_.str(bytes(le(4)))); return;     // BINUNICODE
    case 0x8c: push(doc_.str(bytes(le(1)))); return;    // SHORT_BINUNICODE
    case 0x8d: push(doc_.str(bytes(le(8)))); return;    // BINUNICODE8
    case 'U': push(doc_.str(bytes(le(1)))); return;     // SHORT_BINSTRING (Python 2 str)
    case 'T': {                                         // BINSTRING
      const int64_t n = int32_t(uint32_t(le(4)));
      MG_REQUIRE(n >= 0, where(at), "negative BINSTRING length");
      push(doc_.str(bytes(uint64_t(n))));
      return;
    }
    case 'B':     // BINBYTES
    case 'C':     // SHORT_BINBYTES
    case 0x8e:    // BINBYTES8
    case 0x96: {  // BYTEARRAY8
      Value* v = doc_.make(Kind::Bytes);
      v->text = bytes(le(op == 'B' ? 4 : op == 'C' ? 1 : 8));
      push(v);
      return;
    }
    case ')': push(doc_.tuple({})); return;
    case 0x85: {  // TUPLE1..3
      Value* a = pop(at);
      push(doc_.tuple({a}));
      return;
    }
    case 0x86: {
      Value* b = pop(at);
      Value* a = pop(at);
      push(doc_.tuple({a, b}));
      return;
    }
    case 0x87: {
      Value* c = pop(at);
      Value* b = pop(at);
      Value* a = pop(at);
      push(doc_.tuple({a, b, c}));
      return;
    }
    case 't': push(doc_.tuple(pop_mark(at))); return;
    case ']': push(doc_.list()); return;
    case 'l': push(doc_.list(pop_mark(at))); return;
    case 0x8f: push(doc_.list()); return;                // EMPTY_SET (kept as a list)
    case 0x91: push(doc_.list(pop_mark(at))); return;    // FROZENSET
    case 'a': {                                          // APPEND
      Value* v = pop(at);
      Value* l = top(at);
      MG_REQUIRE(l->kind == Kind::List, where(at), "APPEND to a ", kind_name(l->kind));
      l->items.push_back(v);
      return;
    }
    case 'e':      // APPENDS
    case 0x90: {   // ADDITEMS (sets are lists here)
      std::vector<Value*> items = pop_mark(at);
      Value* l = top(at);
      MG_REQUIRE(l->kind == Kind::List, where(at), "APPENDS to a ", kind_name(l->kind));
      l->items.insert(l->items.end(), items.begin(), items.end());
      return;
    }
    case '}': push(doc_.dict()); return;
    case 'd': {  // DICT
      std::vector<Value*> kv = pop_mark(at);
      MG_REQUIRE(kv.size() % 2 == 0, where(at), "DICT with an odd number of items");
      Value* d = doc_.dict();
      for (size_t i = 0; i < kv.size(); i += 2) d->entries.emplace_back(kv[i], kv[i + 1]);
      push(d);
      return;
    }
    case 's': {  // SETITEM
      Value* v = pop(at);
      Value* k = pop(at);
      Value* d = top(at);
      MG_REQUIRE(d->kind == Kind::Dict, where(at), "SETITEM on a ", kind_name(d->kind));
      d->entries.emplace_back(k, v);
      return;
    }
    case 'u': {  // SETITEMS
      std::vector<Value*> kv = pop_mark(at);
      MG_REQUIRE(kv.size() % 2 == 0, where(at), "SETITEMS with an odd number of items");
      Value* d = top(at);
      MG_REQUIRE(d->kind == Kind::Dict, where(at), "SETITEMS on a ", kind_name(d->kind));
      for (size_t i = 0; i < kv.size(); i += 2) d->entries.emplace_back(kv[i], kv[i + 1]);
      return;
    }
    case 'h': push(memo_get(le(1), at)); return;   // BINGET
    case 'j': push(memo_get(le(4), at)); return;   // LONG_BINGET
    case 'q': memo_put(le(1), top(at)); return;    // BINPUT
    case 'r': memo_put(le(4), top(at)); return;    // LONG_BINPUT
    case 0x94: memo_put(memo_.size(), top(at)); return;  // MEMOIZE
    case 'c': {  // GLOBAL "module\nname\n"
      const std::string module = line();
      const std::string name = line();
      push(global(module, name, at));
      return;
    }
    case 0x93: {  // STACK_GLOBAL
      Value* name = pop(at);
      Value* module = pop(at);
      MG_REQUIRE(module->kind == Kind::Str && name->kind == Kind::Str, where(at),
                 "STACK_GLOBAL needs two strings");
      push(global(module->text, name->text, at));
      return;
    }
    case 'R': {  // REDUCE
      Value* args = pop(at);
      Value* f = pop(at);
      push(call(f, args, at));
      return;
    }
    case 0x81: {  // NEWOBJ
      Value* args = pop(at);
      Value* cls = pop(at);
      push(newobj(cls, args, at));
      return;
    }
    case 0x92: {  // NEWOBJ_EX
      Value* kwargs = pop(at);
      Value* args = pop(at);
      Value* cls = pop(at);
      MG_REQUIRE(kwargs->kind == Kind::Dict && kwargs->entries.empty(), where(at),
                 "NEWOBJ_EX with keyword arguments is not used by PyTorch checkpoints");
      push(newobj(cls, args, at));
      return;
    }
    case 'b': {  // BUILD
      Value* state = pop(at);
      build(top(at), state, at);
      return;
    }
    case 'Q': {  // BINPERSID
      Value* pid = pop(at);
      push(persistent(pid, at));
      return;
    }
    default: break;
  }
  const char* what = "an unknown opcode";
  switch (op) {
    case 'i': what = "INST (calls a class by name)"; break;
    case 'o': what = "OBJ (builds an arbitrary object)"; break;
    case 0x82: case 0x83: case 0x84: what = "EXT (the copyreg extension registry)"; break;
    case 'P': what = "PERSID (text persistent id)"; break;
    case 0x97: case 0x98: what = "an out-of-band buffer opcode"; break;
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'g': case 'p':
      what = "a protocol-0 text opcode"; break;
    default: break;
  }
  MG_THROW(where(at), what, " (0x", "0123456789abcdef"[op >> 4], "0123456789abcdef"[op & 15],
           "), which PyTorch checkpoints do not use: refusing to load it (corrupted or not a "
           "PyTorch checkpoint)");
}

Document unpickle_with(std::span<const uint8_t> bytes, const std::string& label, size_t* consumed,
                       bool distcp_classes) {
  try {
    Unpickler u(bytes, label);
    u.allow_distcp_classes(distcp_classes);
    return u.run(consumed);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(label)) throw;
    throw Error(label + ": " + e.what());  // limits hit inside Document name the file too
  }
}

}  // namespace

Document unpickle(std::span<const uint8_t> bytes, const std::string& label, size_t* consumed) {
  return unpickle_with(bytes, label, consumed, false);
}

Document unpickle_distcp_metadata(std::span<const uint8_t> bytes, const std::string& label) {
  return unpickle_with(bytes, label, nullptr, true);
}

}  // namespace megatron::pickle
