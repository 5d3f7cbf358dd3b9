// The value tree of pickles; see pickle.h. The reader is pickle_reader.cpp (opcodes) and
// pickle_globals.cpp (the globals it knows), the protocol-2 writer pickle_writer.cpp.
#include "core/pickle.h"

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
std::vector<const Value*> Document::values_of(Kind k) const {
  std::vector<const Value*> out;
  for (const Value& v : arena_)
    if (v.kind == k) out.push_back(&v);
  return out;
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

}  // namespace megatron::pickle
