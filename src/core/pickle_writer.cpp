// The protocol-2 pickle writer (what torch.save emits for a checkpoint) and its protocol-4 form
// (pickle.dump's default in Python 3.8 to 3.13); see pickle.h.
#include <bit>
#include <map>

#include "core/error.h"
#include "core/pickle.h"

namespace megatron::pickle {

namespace {

const char* storage_class(DType t) {
  switch (t) {
    case DType::F32: return "FloatStorage";
    case DType::F64: return "DoubleStorage";
    case DType::F16: return "HalfStorage";
    case DType::BF16: return "BFloat16Storage";
    case DType::I64: return "LongStorage";
    case DType::I32: return "IntStorage";
    case DType::I16: return "ShortStorage";
    case DType::I8: return "CharStorage";
    case DType::U8: return "ByteStorage";
    default: break;
  }
  MG_THROW("a ", dtype_name(t), " tensor has no PyTorch storage type to be saved as");
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::I16: return "int16";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    default: break;
  }
  MG_THROW("no torch dtype for ", dtype_name(t));
}

class Pickler {
 public:
  Pickler(std::vector<std::pair<std::string, Tensor>>& storages, int protocol)
      : storages_(storages), proto_(protocol) {}

  std::vector<uint8_t> run(const Value& root) {
    value(root, 0);
    op('.');
    const uint8_t proto[2] = {0x80, uint8_t(proto_)};  // PROTO, outside any frame
    if (proto_ < 4) {
      out_.insert(out_.begin(), proto, proto + 2);
      return std::move(out_);
    }
    std::vector<uint8_t> out(proto, proto + 2);
    out.reserve(out_.size() + 2 + 9 * (out_.size() / kFrameTarget + 1));
    // Protocol 4's frames: the body cut at object boundaries once a frame holds 64 KiB, each
    // FRAME <8-byte length> (frames under 4 bytes go without), as pickle's framer writes them.
    boundaries_.push_back(out_.size());
    size_t start = 0;
    for (size_t b : boundaries_) {
      if (b - start < kFrameTarget && b != out_.size()) continue;
      if (b - start >= 4) {
        out.push_back(0x95);
        for (int i = 0; i < 8; ++i) out.push_back(uint8_t(uint64_t(b - start) >> (8 * i)));
      }
      out.insert(out.end(), out_.begin() + std::ptrdiff_t(start), out_.begin() + std::ptrdiff_t(b));
      start = b;
    }
    return out;
  }

 private:
  void op(uint8_t b) { out_.push_back(b); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(uint8_t(v >> (8 * i)));
  }
  void raw(const std::string& s) { out_.insert(out_.end(), s.begin(), s.end()); }
  void global(const char* module, const char* name) {
    if (proto_ < 4) {
      op('c');
      raw(module);
      op('\n');
      raw(name);
      op('\n');
      return;
    }
    // STACK_GLOBAL of the two strings, memoized as pickle does; again: BINGET of the memo.
    const std::string key = std::string(module) + "\n" + name;
    if (auto it = globals_.find(key); it != globals_.end()) {
      if (it->second < 256) {
        op('h');
        le(uint64_t(it->second), 1);
      } else {
        op('j');
        le(uint64_t(it->second), 4);
      }
      return;
    }
    text(module);
    op(0x94);  // MEMOIZE
    text(name);
    op(0x94);
    op(0x93);  // STACK_GLOBAL
    op(0x94);
    memo_ += 3;
    globals_[key] = memo_ - 1;
  }
  void text(const std::string& s) {
    if (proto_ >= 4 && s.size() < 256) {
      op(0x8c);  // SHORT_BINUNICODE
      le(s.size(), 1);
    } else {
      op('X');
      le(s.size(), 4);
    }
    raw(s);
  }
  void integer(int64_t i) {
    if (i >= 0 && i < 256) {
      op('K');
      le(uint64_t(i), 1);
    } else if (i >= 0 && i < 65536) {
      op('M');
      le(uint64_t(i), 2);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      op('J');
      le(uint64_t(uint32_t(int32_t(i))), 4);
    } else {  // LONG1: the shortest little-endian two's complement
      int n = 8;
      while (n > 1) {
        const int64_t hi = i >> (8 * (n - 1) - 1);
        if (hi != 0 && hi != -1) break;
        --n;
      }
      op(0x8a);
      op(uint8_t(n));
      le(uint64_t(i), n);
    }
  }
  void real(double d) {
    op('G');
    const uint64_t u = std::bit_cast<uint64_t>(d);
    for (int i = 7; i >= 0; --i) op(uint8_t(u >> (8 * i)));
  }
  void bytes(const std::string& b) {  // protocol 2 has no bytes opcode: _codecs.encode(latin-1)
    if (proto_ >= 4) {
      if (b.size() < 256) {
        op('C');  // SHORT_BINBYTES
        le(b.size(), 1);
      } else {
        op('B');  // BINBYTES
        le(b.size(), 4);
      }
      raw(b);
      return;
    }
    if (b.empty()) {
      global("__builtin__", "bytes");
      op(')');
      op('R');
      return;
    }
    global("_codecs", "encode");
    std::string utf8;
    for (char c : b) {
      const uint8_t u = uint8_t(c);
      if (u < 0x80) {
        utf8.push_back(c);
      } else {
        utf8.push_back(char(0xc0 | (u >> 6)));
        utf8.push_back(char(0x80 | (u & 0x3f)));
      }
    }
    text(utf8);
    text("latin1");
    op(0x86);
    op('R');
  }
  void items(const std::vector<Value*>& v, int depth) {
    for (const Value* x : v) value(*x, depth + 1);
  }
  void int_tuple(const Shape& s) {
    if (s.empty()) {
      op(')');
      return;
    }
    op('(');
    for (int64_t x : s) integer(x);
    op('t');
  }
  void int_tuple_of(const Value& v, int depth) {  // a plain tuple of v's items
    Value t;
    t.kind = Kind::Tuple;
    t.items = v.items;
    value(t, depth + 1);
  }
  void entries(const Value& m, int depth) {
    if (m.entries.empty()) return;
    op('(');
    for (const auto& [k, v] : m.entries) {
      value(*k, depth + 1);
      value(*v, depth + 1);
    }
    op('u');
  }
  void tensor(const Value& v) {
    MG_CHECK(v.data.defined() && v.data.device().is_cpu(), "pickle: a tensor without CPU data");
    const Tensor t = v.data.contiguous();
    const std::string key = std::to_string(storages_.size());
    storages_.emplace_back(key, t);
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');
    text("storage");
    global("torch", storage_class(t.dtype()));
    text(key);
    text("cpu");
    integer(t.numel());
    op('t');
    op('Q');  // BINPERSID
    integer(0);
    int_tuple(t.shape());
    int_tuple(t.strides());
    op(0x89);  // requires_grad False
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }
  void ndarray(const Value& v) {
    global("numpy.core.multiarray", "_reconstruct");
    global("numpy", "ndarray");
    integer(0);
    op(0x85);
    bytes("b");
    op(0x87);
    op('R');
    op('(');
    integer(1);
    int_tuple(v.shape);
    global("numpy", "dtype");
    text(v.member.substr(1));
    op(0x89);
    op(0x88);
    op(0x87);
    op('R');
    op('(');  // dtype state: (3, byte order, None, None, None, -1, -1, 0)
    integer(3);
    text(v.member.substr(0, 1));
    op('N');
    op('N');
    op('N');
    integer(-1);
    integer(-1);
    integer(0);
    op('t');
    op('b');
    op(0x89);  // C order
    bytes(v.text);
    op('t');
    op('b');
  }

  void value(const Value& v, int depth) {
    MG_CHECK(depth < 64, "pickle: nesting deeper than 64 (a cycle?)");
    if (proto_ >= 4) boundaries_.push_back(out_.size());
    switch (v.kind) {
      case Kind::None: op('N'); return;
      case Kind::Bool: op(v.boolean ? 0x88 : 0x89); return;
      case Kind::Int: integer(v.integer); return;
      case Kind::Float: real(v.real); return;
      case Kind::Str: text(v.text); return;
      case Kind::Bytes: bytes(v.text); return;
      case Kind::Tuple:
        if (v.text == "torch.Size") {  // torch.Size((d0, d1, ...))
          global("torch", "Size");
          int_tuple_of(v, depth);
          op(0x85);  // TUPLE1
          op('R');
          return;
        }
        if (v.items.empty()) {
          op(')');
        } else if (v.items.size() <= 3) {
          items(v.items, depth);
          op(uint8_t(0x84 + v.items.size()));  // TUPLE1..3
        } else {
          op('(');
          items(v.items, depth);
          op('t');
        }
        return;
      case Kind::List:
        op(']');
        if (!v.items.empty()) {
          op('(');
          items(v.items, depth);
          op('e');
        }
        return;
      case Kind::Dict:
        if (v.ordered) {
          global("collections", "OrderedDict");
          op(')');
          op('R');
        } else {
          op('}');
        }
        entries(v, depth);
        return;
      case Kind::Namespace:
        if (v.text.empty()) {
          global("argparse", "Namespace");
        } else {  // types.SimpleNamespace or a data class: module.Class
          const size_t dot = v.text.rfind('.');
          MG_CHECK(dot != std::string::npos, "pickle: object of class '", v.text, "'");
          global(v.text.substr(0, dot).c_str(), v.text.substr(dot + 1).c_str());
        }
        op(')');
        op(0x81);  // NEWOBJ
        if (!v.items.empty()) {  // a tuple state (__getstate__ returning a tuple)
          Value state;
          state.kind = Kind::Tuple;
          state.items = v.items;
          value(state, depth + 1);
        } else {
          op('}');
          entries(v, depth);
        }
        op('b');
        return;
      case Kind::Enum: {
        // A member by value (Class(value), as Python 3.12 pickles enums) or by name
        // (getattr(Class, 'NAME')); torch's own constants (torch.strided) by their name.
        if (v.text == "torch" && v.member == "strided") {  // torch.layout.__reduce__'s form
          global("torch.serialization", "_get_layout");
          text("torch.strided");
          op(0x85);  // TUPLE1
          op('R');
          return;
        }
        if (v.text == "torch") {
          global("torch", v.member.c_str());
          return;
        }
        const size_t dot = v.text.rfind('.');
        MG_CHECK(dot != std::string::npos, "pickle: enum of class '", v.text, "'");
        if (!v.member.empty()) global("builtins", "getattr");
        global(v.text.substr(0, dot).c_str(), v.text.substr(dot + 1).c_str());
        if (!v.member.empty()) {
          text(v.member);
          op(0x86);  // TUPLE2
        } else {
          MG_CHECK(v.items.size() == 1, "pickle: enum value");
          value(*v.items[0], depth + 1);
          op(0x85);  // TUPLE1
        }
        op('R');
        return;
      }
      case Kind::TorchDType: global("torch", torch_dtype_name(v.dtype)); return;
      case Kind::Tensor: tensor(v); return;
      case Kind::NdArray: ndarray(v); return;
      default: break;
    }
    MG_CHECK(false, "pickle: cannot write a ", kind_name(v.kind));
  }

  static constexpr size_t kFrameTarget = 64 * 1024;
  std::vector<std::pair<std::string, Tensor>>& storages_;
  const int proto_;
  std::vector<uint8_t> out_;            // the body after PROTO
  std::vector<size_t> boundaries_;      // protocol 4: where each object starts in out_
  std::map<std::string, int> globals_;  // protocol 4: "module\nname" -> its memo index
  int memo_ = 0;
};

}  // namespace

std::vector<uint8_t> pickle(const Value& root, std::vector<std::pair<std::string, Tensor>>& storages, int protocol) {
  MG_CHECK(protocol == 2 || protocol == 4, "pickle: protocol ", protocol, " is not written");
  return Pickler(storages, protocol).run(root);
}

}  // namespace megatron::pickle
