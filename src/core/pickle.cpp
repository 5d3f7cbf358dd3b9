// The restricted unpickler and the value tree; see pickle.h. The protocol-2 writer is in
// pickle_writer.cpp.
#include "core/pickle.h"

#include <bit>
#include <cstring>
#include <unordered_map>

#include "core/error.h"

namespace megatron::pickle {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "argparse.Namespace";
    case Kind::Global: return "class";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
    case Kind::TorchDType: return "torch.dtype";
    case Kind::NumpyDType: return "numpy.dtype";
    case Kind::NdArray: return "numpy.ndarray";
    case Kind::Enum: return "enum";
  }
  return "?";
}

namespace {

bool same_key(const Value* k, std::string_view s) { return k->kind == Kind::Str && k->text == s; }
bool same_key(const Value* k, int64_t i) { return k->kind == Kind::Int && k->integer == i; }

template <typename K>
const Value* lookup(const Value& m, K key) {
  if (m.kind != Kind::Dict && m.kind != Kind::Namespace) return nullptr;
  for (auto it = m.entries.rbegin(); it != m.entries.rend(); ++it)
    if (same_key(it->first, key)) return it->second;
  return nullptr;
}

}  // namespace

const Value* Value::get(std::string_view key) const { return lookup(*this, key); }
const Value* Value::get(int64_t key) const { return lookup(*this, key); }

std::string Value::describe() const {
  switch (kind) {
    case Kind::Int: return str("int ", integer);
    case Kind::Float: return str("float ", real);
    case Kind::Bool: return boolean ? "True" : "False";
    case Kind::Str: return str("str '", text.substr(0, 60), text.size() > 60 ? "...'" : "'");
    case Kind::Bytes: return str("bytes of length ", text.size());
    case Kind::Tuple:
    case Kind::List: return str(kind_name(kind), " of ", items.size(), " items");
    case Kind::Dict:
    case Kind::Namespace: return str(kind_name(kind), " of ", entries.size(), " entries");
    case Kind::Global:
    case Kind::Enum: return str(kind_name(kind), " ", text);
    case Kind::Tensor: return str("tensor of shape ", shape_str(shape));
    default: return kind_name(kind);
  }
}

Value* Document::make(Kind k) {
  MG_REQUIRE(arena_.size() < kMaxPickleObjects, "the pickle builds more than ", kMaxPickleObjects,
             " objects: not a checkpoint (a Megatron-LM checkpoint's pickle has far fewer)");
  arena_.emplace_back();
  arena_.back().kind = k;
  return &arena_.back();
}
Value* Document::boolean(bool b) {
  Value* v = make(Kind::Bool);
  v->boolean = b;
  return v;
}
Value* Document::integer(int64_t i) {
  Value* v = make(Kind::Int);
  v->integer = i;
  return v;
}
Value* Document::real(double d) {
  Value* v = make(Kind::Float);
  v->real = d;
  return v;
}
Value* Document::str(std::string s) {
  Value* v = make(Kind::Str);
  v->text = std::move(s);
  return v;
}
Value* Document::tuple(std::vector<Value*> items) {
  Value* v = make(Kind::Tuple);
  v->items = std::move(items);
  return v;
}
Value* Document::list(std::vector<Value*> items) {
  Value* v = make(Kind::List);
  v->items = std::move(items);
  return v;
}
Value* Document::dict(bool ordered) {
  Value* v = make(Kind::Dict);
  v->ordered = ordered;
  return v;
}
Value* Document::namespace_() { return make(Kind::Namespace); }
Value* Document::tensor(const Tensor& t) {
  Value* v = make(Kind::Tensor);
  v->data = t;
  v->dtype = t.dtype();
  v->shape = t.shape();
  return v;
}
Value* Document::torch_dtype(DType t) {
  Value* v = make(Kind::TorchDType);
  v->dtype = t;
  return v;
}
Value* Document::ndarray(std::string raw, std::string descr, Shape shape) {
  Value* v = make(Kind::NdArray);
  v->text = std::move(raw);
  v->member = std::move(descr);
  v->shape = std::move(shape);
  return v;
}
void Document::set(Value* mapping, Value* key, Value* value) {
  MG_CHECK(mapping->kind == Kind::Dict || mapping->kind == Kind::Namespace, "set on a ",
           kind_name(mapping->kind));
  mapping->entries.emplace_back(key, value);
}

// ---------------------------------------------------------------------------------------------
// The globals the reader knows.

namespace {

enum class Known {
  OrderedDict, Namespace, RebuildTensorV2, RebuildTensor, RebuildParameter, TorchSize, Storage,
  TorchDType, NumpyReconstruct, NumpyNdarray, NumpyDType, NumpyScalar, CodecsEncode, Bytes, Set,
  Getattr, MegatronEnum, BytesIO,
};

struct StorageType {
  const char* name;
  DType dtype;
  bool is_bool;
};
constexpr StorageType kStorages[] = {
    {"FloatStorage", DType::F32, false},  {"DoubleStorage", DType::F64, false},
    {"HalfStorage", DType::F16, false},   {"BFloat16Storage", DType::BF16, false},
    {"LongStorage", DType::I64, false},   {"IntStorage", DType::I32, false},
    {"ShortStorage", DType::I16, false},  {"CharStorage", DType::I8, false},
    {"ByteStorage", DType::U8, false},    {"BoolStorage", DType::U8, true},
};
constexpr StorageType kTorchDTypes[] = {
    {"float32", DType::F32, false}, {"float", DType::F32, false},   {"float64", DType::F64, false},
    {"double", DType::F64, false},  {"float16", DType::F16, false}, {"half", DType::F16, false},
    {"bfloat16", DType::BF16, false}, {"int64", DType::I64, false}, {"long", DType::I64, false},
    {"int32", DType::I32, false},   {"int", DType::I32, false},     {"int16", DType::I16, false},
    {"short", DType::I16, false},   {"int8", DType::I8, false},     {"uint8", DType::U8, false},
    {"bool", DType::U8, true},
};
// Enums Megatron-LM keeps in its argument namespace (megatron.core.transformer.enums,
// megatron.model.enums, megatron.core.enums, ...).
constexpr const char* kMegatronEnums[] = {
    "AttnBackend", "AttnMaskType", "AttnType", "ModelType", "PositionEmbeddingType", "LayerType",
    "Fp8Recipe", "Fp4Recipe", "CudaGraphScope", "ActivationType", "RouterType",
};

struct GlobalInfo {
  Known known;
  DType dtype = DType::F32;
  bool is_bool = false;
};

bool classify(const std::string& module, const std::string& name, GlobalInfo* out) {
  auto set = [&](Known k) {
    out->known = k;
    return true;
  };
  const bool builtins = module == "builtins" || module == "__builtin__";
  const bool numpy_core = module == "numpy.core.multiarray" || module == "numpy._core.multiarray";
  if (module == "collections" && name == "OrderedDict") return set(Known::OrderedDict);
  if (module == "argparse" && name == "Namespace") return set(Known::Namespace);
  if (module == "torch._utils" && name == "_rebuild_tensor_v2") return set(Known::RebuildTensorV2);
  if (module == "torch._utils" && name == "_rebuild_tensor") return set(Known::RebuildTensor);
  if (module == "torch._utils" && name == "_rebuild_parameter") return set(Known::RebuildParameter);
  if (module == "torch" && name == "Size") return set(Known::TorchSize);
  if (module == "torch" || module == "torch.cuda") {
    for (const StorageType& s : kStorages)
      if (name == s.name) {
        out->dtype = s.dtype;
        out->is_bool = s.is_bool;
        return set(Known::Storage);
      }
  }
  if (module == "torch") {
    for (const StorageType& s : kTorchDTypes)
      if (name == s.name) {
        out->dtype = s.dtype;
        out->is_bool = s.is_bool;
        return set(Known::TorchDType);
      }
  }
  if (numpy_core && name == "_reconstruct") return set(Known::NumpyReconstruct);
  if (numpy_core && name == "scalar") return set(Known::NumpyScalar);
  if (module == "numpy" && name == "ndarray") return set(Known::NumpyNdarray);
  if (module == "numpy" && name == "dtype") return set(Known::NumpyDType);
  if (module == "_codecs" && name == "encode") return set(Known::CodecsEncode);
  if (builtins && (name == "bytes" || name == "bytearray")) return set(Known::Bytes);
  if (builtins && (name == "set" || name == "frozenset")) return set(Known::Set);
  if (builtins && name == "getattr") return set(Known::Getattr);
  // Transformer Engine's _extra_state of older versions: io.BytesIO(bytes), kept as bytes.
  if ((module == "_io" || module == "io") && name == "BytesIO") return set(Known::BytesIO);
  if (module.starts_with("megatron.") && module.find("enums") != std::string::npos)
    for (const char* e : kMegatronEnums)
      if (name == e) return set(Known::MegatronEnum);
  return false;
}

// NumPy's type strings for the element types the RNG state and scalars use.
struct NumpyType {
  char kind;  // 'u', 'i', 'f', 'b'
  int size;
};
bool parse_numpy_type(const std::string& s, NumpyType* t) {
  std::string d = s;
  if (!d.empty() && (d[0] == '<' || d[0] == '|' || d[0] == '=')) d.erase(0, 1);
  if (d.size() != 2 || (d[0] != 'u' && d[0] != 'i' && d[0] != 'f' && d[0] != 'b')) return false;
  const int n = d[1] - '0';
  if (n != 1 && n != 2 && n != 4 && n != 8) return false;
  if (d[0] == 'f' && n == 1) return false;
  if (d[0] == 'b' && n != 1) return false;
  *t = {d[0], n};
  return true;
}

// ---------------------------------------------------------------------------------------------

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> in, const std::string& label) : in_(in), label_(label) {}

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
  Value* global(const std::string& module, const std::string& name, size_t at);
  Value* call(Value* callable, Value* args, size_t at);
  Value* newobj(Value* cls, Value* args, size_t at);
  void build(Value* obj, Value* state, size_t at);
  Value* persistent(Value* pid, size_t at);

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

Value* Unpickler::global(const std::string& module, const std::string& name, size_t at) {
  GlobalInfo info{};
  MG_REQUIRE(classify(module, name, &info), where(at), "refers to the global '", module, ".", name,
             "', which a Megatron-LM checkpoint never uses; refusing to load this file (nothing "
             "was executed). Only tensors, storages, containers, argparse.Namespace, OrderedDict, "
             "NumPy RNG state and Megatron's argument enums are accepted");
  if (info.known == Known::TorchDType) {
    Value* v = doc_.torch_dtype(info.dtype);
    v->is_bool = info.is_bool;
    return v;
  }
  Value* v = doc_.make(Kind::Global);
  v->text = module + "." + name;
  v->integer = int64_t(info.known);
  v->dtype = info.dtype;
  v->is_bool = info.is_bool;
  return v;
}

namespace {

Known known_of(const Value* v) { return Known(v->integer); }

bool int_tuple(const Value* v, Shape* out) {
  if (v->kind != Kind::Tuple && v->kind != Kind::List) return false;
  out->clear();
  for (const Value* x : v->items) {
    if (x->kind != Kind::Int) return false;
    out->push_back(x->integer);
  }
  return true;
}

// latin-1 text (code points < 256, UTF-8 encoded in the pickle) back to bytes.
bool latin1_bytes(const std::string& utf8, std::string* out) {
  out->clear();
  for (size_t i = 0; i < utf8.size(); ++i) {
    const uint8_t c = uint8_t(utf8[i]);
    if (c < 0x80) {
      out->push_back(char(c));
    } else if ((c & 0xe0) == 0xc0 && c <= 0xc3 && i + 1 < utf8.size() &&
               (uint8_t(utf8[i + 1]) & 0xc0) == 0x80) {
      out->push_back(char(((c & 0x1f) << 6) | (uint8_t(utf8[i + 1]) & 0x3f)));
      ++i;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

Value* Unpickler::call(Value* f, Value* args, size_t at) {
  MG_REQUIRE(f->kind == Kind::Global, where(at), "REDUCE calls a ", f->describe(),
             " (corrupted pickle)");
  MG_REQUIRE(args->kind == Kind::Tuple, where(at), "REDUCE arguments are a ", args->describe());
  const std::vector<Value*>& a = args->items;
  auto bad = [&]() -> Value* {
    MG_THROW(where(at), f->text, " called with unexpected arguments (", args->describe(),
             "): not a PyTorch checkpoint as Megatron-LM writes it");
  };
  switch (known_of(f)) {
    case Known::OrderedDict: {
      Value* d = doc_.dict(true);
      if (a.empty()) return d;
      if (a.size() != 1 || (a[0]->kind != Kind::List && a[0]->kind != Kind::Tuple)) return bad();
      for (Value* kv : a[0]->items) {
        if (kv->kind != Kind::Tuple || kv->items.size() != 2) return bad();
        d->entries.emplace_back(kv->items[0], kv->items[1]);
      }
      return d;
    }
    case Known::Namespace:
      if (!a.empty()) return bad();
      return doc_.namespace_();
    case Known::RebuildTensorV2:
    case Known::RebuildTensor: {
      // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]])
      const bool v2 = known_of(f) == Known::RebuildTensorV2;
      if (a.size() < 4 || (v2 && a.size() != 6 && a.size() != 7) || (!v2 && a.size() != 4))
        return bad();
      if (a[0]->kind != Kind::Storage || a[1]->kind != Kind::Int) return bad();
      Value* t = doc_.make(Kind::Tensor);
      t->storage = a[0];
      t->dtype = a[0]->dtype;
      t->is_bool = a[0]->is_bool;
      t->storage_offset = a[1]->integer;
      if (!int_tuple(a[2], &t->shape) || !int_tuple(a[3], &t->stride)) return bad();
      MG_REQUIRE(t->shape.size() == t->stride.size() && t->shape.size() <= 16 && t->storage_offset >= 0,
                 where(at), "a tensor with ", t->shape.size(), " sizes, ", t->stride.size(),
                 " strides and storage offset ", t->storage_offset, " (corrupted file)");
      return t;
    }
    case Known::RebuildParameter:  // (data, requires_grad, backward_hooks)
      if (a.size() != 3 || a[0]->kind != Kind::Tensor) return bad();
      return a[0];
    case Known::TorchSize:
      if (a.size() != 1 || (a[0]->kind != Kind::Tuple && a[0]->kind != Kind::List)) return bad();
      return doc_.tuple(a[0]->items);
    case Known::CodecsEncode: {  // protocol 2's bytes: _codecs.encode(latin-1 text, 'latin1')
      if (a.size() != 2 || a[0]->kind != Kind::Str || a[1]->kind != Kind::Str ||
          (a[1]->text != "latin1" && a[1]->text != "latin-1"))
        return bad();
      Value* b = doc_.make(Kind::Bytes);
      MG_REQUIRE(latin1_bytes(a[0]->text, &b->text), where(at),
                 "_codecs.encode of text that is not latin-1 (corrupted pickle)");
      return b;
    }
    case Known::Bytes: {
      Value* b = doc_.make(Kind::Bytes);
      if (a.empty()) return b;
      if (a.size() == 1 && a[0]->kind == Kind::Bytes) {
        b->text = a[0]->text;
        return b;
      }
      return bad();
    }
    case Known::BytesIO: {  // (initial bytes[, position]), then BUILD with its __dict__
      Value* b = doc_.make(Kind::Bytes);
      b->member = "BytesIO";
      if (a.empty()) return b;
      if (a.size() > 2 || a[0]->kind != Kind::Bytes) return bad();
      b->text = a[0]->text;
      return b;
    }
    case Known::Set:
      if (a.empty()) return doc_.list();
      if (a.size() != 1 || (a[0]->kind != Kind::List && a[0]->kind != Kind::Tuple)) return bad();
      return doc_.list(a[0]->items);
    case Known::NumpyReconstruct: {  // (numpy.ndarray, (0,), b'b'), then BUILD
      if (a.size() != 3 || a[0]->kind != Kind::Global || known_of(a[0]) != Known::NumpyNdarray)
        return bad();
      Value* v = doc_.make(Kind::NdArray);
      v->member = "|u1";
      return v;
    }
    case Known::NumpyDType: {  // numpy.dtype('u4', False, True), then BUILD
      if (a.empty() || a.size() > 3 || a[0]->kind != Kind::Str) return bad();
      NumpyType t{};
      MG_REQUIRE(parse_numpy_type(a[0]->text, &t), where(at), "numpy.dtype('", a[0]->text.substr(0, 16),
                 "') is not an element type a Megatron checkpoint uses");
      Value* v = doc_.make(Kind::NumpyDType);
      v->member = (a[0]->text[0] == '<' || a[0]->text[0] == '|') ? a[0]->text : "<" + a[0]->text;
      return v;
    }
    case Known::NumpyScalar: {  // numpy.core.multiarray.scalar(dtype, raw bytes)
      if (a.size() != 2 || a[0]->kind != Kind::NumpyDType || a[1]->kind != Kind::Bytes) return bad();
      NumpyType t{};
      if (!parse_numpy_type(a[0]->member, &t) || a[1]->text.size() != size_t(t.size) ||
          a[0]->member[0] == '>')
        return bad();
      uint64_t u = 0;
      for (int i = 0; i < t.size; ++i) u |= uint64_t(uint8_t(a[1]->text[size_t(i)])) << (8 * i);
      if (t.kind == 'f') {
        if (t.size == 8) return doc_.real(std::bit_cast<double>(u));
        if (t.size == 4) return doc_.real(std::bit_cast<float>(uint32_t(u)));
        return doc_.real(fp16_to_float(fp16{uint16_t(u)}));
      }
      if (t.kind == 'b') return doc_.boolean(u != 0);
      if (t.kind == 'i' && t.size < 8 && (u >> (8 * t.size - 1)) & 1) u |= ~uint64_t(0) << (8 * t.size);
      return integer(int64_t(u));
    }
    case Known::Getattr: {  // getattr(EnumClass, 'member'): how Python 3.11+ pickles enums
      if (a.size() != 2 || a[0]->kind != Kind::Global || known_of(a[0]) != Known::MegatronEnum ||
          a[1]->kind != Kind::Str)
        return bad();
      Value* e = doc_.make(Kind::Enum);
      e->text = a[0]->text;
      e->member = a[1]->text;
      return e;
    }
    case Known::MegatronEnum: {  // EnumClass(value)
      if (a.size() != 1 || (a[0]->kind != Kind::Int && a[0]->kind != Kind::Str)) return bad();
      Value* e = doc_.make(Kind::Enum);
      e->text = f->text;
      e->items = {a[0]};
      return e;
    }
    default: break;
  }
  MG_THROW(where(at), "calls ", f->text, ", which a PyTorch checkpoint never calls (corrupted pickle)");
}

Value* Unpickler::newobj(Value* cls, Value* args, size_t at) {
  MG_REQUIRE(cls->kind == Kind::Global && args->kind == Kind::Tuple && args->items.empty(),
             where(at), "NEWOBJ of ", cls->describe(), " with ", args->describe(),
             " (only argparse.Namespace, OrderedDict and io.BytesIO are built this way in checkpoints)");
  if (known_of(cls) == Known::Namespace) return doc_.namespace_();
  if (known_of(cls) == Known::OrderedDict) return doc_.dict(true);
  if (known_of(cls) == Known::BytesIO) {
    Value* b = doc_.make(Kind::Bytes);
    b->member = "BytesIO";
    return b;
  }
  MG_THROW(where(at), "NEWOBJ of ", cls->text, " is not used by PyTorch checkpoints");
}

void Unpickler::build(Value* obj, Value* state, size_t at) {
  switch (obj->kind) {
    case Kind::Namespace: {
      // state: the instance __dict__, or (dict, slot state)
      if (state->kind == Kind::Tuple && state->items.size() == 2) state = state->items[0];
      MG_REQUIRE(state->kind == Kind::Dict, where(at), "argparse.Namespace state is a ",
                 state->describe());
      obj->entries.insert(obj->entries.end(), state->entries.begin(), state->entries.end());
      return;
    }
    case Kind::Bytes:  // an io.BytesIO's state (value, position, __dict__): the value is kept
      MG_REQUIRE(obj->member == "BytesIO", where(at), "BUILD on bytes (corrupted pickle)");
      if (state->kind == Kind::Tuple && !state->items.empty() && state->items[0]->kind == Kind::Bytes)
        obj->text = state->items[0]->text;
      return;
    case Kind::Dict:  // an OrderedDict's instance attributes (state_dict()._metadata): dropped
      MG_REQUIRE(obj->ordered, where(at), "BUILD on a plain dict (corrupted pickle)");
      return;
    case Kind::NumpyDType: {
      // (version, byte order, subarray, names, fields, elsize, alignment, flags)
      MG_REQUIRE(state->kind == Kind::Tuple && state->items.size() >= 2 &&
                     state->items[1]->kind == Kind::Str,
                 where(at), "numpy.dtype state is a ", state->describe());
      const std::string& order = state->items[1]->text;
      MG_REQUIRE(order == "<" || order == "|" || order == "=", where(at),
                 "big-endian NumPy data is not supported (byte order '", order.substr(0, 4), "')");
      obj->member[0] = order == "|" ? '|' : '<';
      return;
    }
    case Kind::NdArray: {
      // ([version,] shape, dtype, is_fortran, raw data)
      MG_REQUIRE(state->kind == Kind::Tuple && (state->items.size() == 4 || state->items.size() == 5),
                 where(at), "numpy.ndarray state is a ", state->describe());
      const size_t o = state->items.size() - 4;
      Value* dt = state->items[o + 1];
      Value* raw = state->items[o + 3];
      MG_REQUIRE(int_tuple(state->items[o], &obj->shape) && obj->shape.size() <= 8 &&
                     dt->kind == Kind::NumpyDType && state->items[o + 2]->kind == Kind::Bool &&
                     raw->kind == Kind::Bytes,
                 where(at), "malformed numpy.ndarray state");
      NumpyType t{};
      MG_CHECK(parse_numpy_type(dt->member, &t), "numpy dtype ", dt->member);
      uint64_t n = uint64_t(t.size);
      for (int64_t d : obj->shape) {
        MG_REQUIRE(d >= 0 && (d == 0 || n <= (uint64_t(1) << 62) / uint64_t(d)), where(at),
                   "numpy.ndarray of impossible shape");
        n *= uint64_t(d);
      }
      MG_REQUIRE(n == raw->text.size(), where(at), "numpy.ndarray of shape ", shape_str(obj->shape),
                 " and type ", dt->member, " holds ", raw->text.size(), " bytes, expected ", n);
      MG_REQUIRE(!state->items[o + 2]->boolean || obj->shape.size() <= 1, where(at),
                 "Fortran-ordered NumPy arrays are not supported");
      obj->member = dt->member;
      obj->text = raw->text;
      return;
    }
    default: break;
  }
  MG_THROW(where(at), "BUILD on a ", obj->describe(), ", which PyTorch checkpoints never do");
}

Value* Unpickler::persistent(Value* pid, size_t at) {
  // ('storage', storage type, key, location, numel) and, in PyTorch's legacy (pre-1.6) format,
  // a sixth item: view metadata (None).
  MG_REQUIRE(pid->kind == Kind::Tuple && (pid->items.size() == 5 || pid->items.size() == 6) &&
                 pid->items[0]->kind == Kind::Str && pid->items[0]->text == "storage",
             where(at), "persistent id ", pid->describe(), " is not a storage reference");
  const std::vector<Value*>& a = pid->items;
  MG_REQUIRE((a[1]->kind == Kind::Global && known_of(a[1]) == Known::Storage) ||
                 a[1]->kind == Kind::TorchDType,
             where(at), "storage of type ", a[1]->describe(), " (not a tensor storage)");
  MG_REQUIRE(a[2]->kind == Kind::Str && a[3]->kind == Kind::Str && a[4]->kind == Kind::Int &&
                 a[4]->integer >= 0,
             where(at), "malformed storage reference (key, location, size)");
  MG_REQUIRE(a.size() == 5 || a[5]->kind == Kind::None, where(at),
             "storage views (files of PyTorch before 0.4) are not supported");
  MG_REQUIRE(a[2]->text.size() <= 64, where(at), "over-long storage key");
  Value* s = doc_.make(Kind::Storage);
  s->dtype = a[1]->dtype;
  s->is_bool = a[1]->is_bool;
  s->text = a[2]->text;
  s->location = a[3]->text.substr(0, 32);
  s->storage_numel = a[4]->integer;
  doc_.storages.push_back(s);
  return s;
}

}  // namespace

bool is_allowed_global(const std::string& module, const std::string& name) {
  GlobalInfo info{};
  return classify(module, name, &info);
}

Document unpickle(std::span<const uint8_t> bytes, const std::string& label, size_t* consumed) {
  try {
    return Unpickler(bytes, label).run(consumed);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(label)) throw;
    throw Error(label + ": " + e.what());  // limits hit inside Document name the file too
  }
}

}  // namespace megatron::pickle
