// The globals the restricted unpickler knows and what each one means (see pickle.h): REDUCE,
// NEWOBJ, BUILD and persistent ids on them build plain values; nothing is ever called.
#include <algorithm>
#include <bit>
#include <cctype>

#include "core/error.h"
#include "core/pickle_internal.h"

namespace megatron::pickle::detail {

namespace {


enum class Known {
  OrderedDict, Namespace, RebuildTensorV2, RebuildTensor, RebuildParameter, TorchSize, Storage,
  TorchDType, NumpyReconstruct, NumpyNdarray, NumpyDType, NumpyScalar, CodecsEncode, Bytes, Set,
  Getattr, PlainClass, BytesIO, SimpleNamespace, Reconstructor, Object, TorchConstant,
  DefaultDict, BuiltinType, GetLayout,
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
// torch dtypes without an element type here (float8, complex, wider unsigned, ...): accepted as
// plain values (an enum "torch.dtype" of that name) in arguments, refused as tensor storages.
constexpr const char* kOtherTorchDTypes[] = {
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "complex32", "complex64", "complex128", "cfloat", "cdouble", "chalf",
    "uint16", "uint32", "uint64", "quint8", "qint8", "qint32", "quint4x2", "bits8", "bits16",
};
// torch's layouts and memory formats (torch.strided, torch.contiguous_format, ...): pickled as
// the module attribute itself, kept as their names.
constexpr const char* kTorchConstants[] = {
    "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn",
    "jagged", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
};

// A class of the modules where Megatron-LM, Megatron-Core, Transformer Engine and
// torch.distributed keep the enums and small data classes their checkpoints hold (AttnBackend,
// InferenceCudaGraphScope, RerunMode, Caller, ...), by its CamelCase name: any class of a module
// named "enums" (a newer release's too), and of the few others that define such types. Such a
// class is never called: an enum member becomes its name or value, an object its attributes.
// Functions (snake_case) and the standard library's process and thread classes are not matched.
bool is_plain_class(const std::string& module, const std::string& name) {
  static const char* const kModules[] = {
      "megatron.core.rerun_state_machine", "megatron.core.dist_checkpointing.validation",
      "megatron.core.dist_checkpointing.mapping", "megatron.core.transformer.cuda_graphs",
      "megatron.core.optimizer.optimizer_config", "megatron.core.transformer.transformer_config",
      "transformer_engine.common.recipe", "torch.distributed.checkpoint.metadata",
      "torch.distributed._shard.sharded_tensor.metadata"};
  static const char* const kRunsCode[] = {"Popen", "Process", "Thread", "Timer", "Pool", "Executor"};
  const bool from = module.starts_with("megatron.") || module.starts_with("transformer_engine.") ||
                    module.starts_with("torch.distributed.");
  const bool enums_module = module.ends_with(".enums") || module.find(".enums.") != std::string::npos;
  const bool listed = std::any_of(std::begin(kModules), std::end(kModules),
                                  [&](const char* m) { return module == m; });
  if (!from || !(enums_module || listed) || name.empty() || name.size() > 64 ||
      !std::isupper(static_cast<unsigned char>(name[0])))
    return false;
  for (const char* r : kRunsCode)
    if (name.find(r) != std::string::npos) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

struct GlobalInfo {
  Known known;
  DType dtype = DType::F32;
  bool is_bool = false;
};

// The private classes of PyTorch's distributed-checkpoint .metadata (and Megatron-Core 0.15's
// root class), accepted only by unpickle_distcp_metadata.
bool is_distcp_class(const std::string& module, const std::string& name) {
  return (module == "torch.distributed.checkpoint.filesystem" && name == "_StorageInfo") ||
         ((module == "torch.distributed.checkpoint.metadata" ||
           module == "torch.distributed._shard.sharded_tensor.metadata") &&
          name == "_MEM_FORMAT_ENCODING") ||
         (module == "megatron.core.dist_checkpointing.strategies.torch" && name == "MCoreMetadata");
}

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
  if (module == "torch") {
    for (const char* d : kOtherTorchDTypes)
      if (name == d) return set(Known::TorchConstant);
    for (const char* d : kTorchConstants)
      if (name == d) return set(Known::TorchConstant);
  }
  if (module == "types" && name == "SimpleNamespace") return set(Known::SimpleNamespace);
  if (module == "copyreg" && name == "_reconstructor") return set(Known::Reconstructor);
  if (builtins && name == "object") return set(Known::Object);
  // collections.defaultdict(int) (Megatron's rerun state machine counts), with its factory
  // (protocol 2 spells int __builtin__.long)
  if (module == "collections" && name == "defaultdict") return set(Known::DefaultDict);
  if (builtins && (name == "int" || name == "long" || name == "float" || name == "str" ||
                   name == "unicode" || name == "list" || name == "dict" || name == "tuple" ||
                   name == "bool"))
    return set(Known::BuiltinType);
  if (is_plain_class(module, name)) return set(Known::PlainClass);
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

// A value an enum member may have: None, numbers, text, bytes and tuples of them.
bool is_plain_value(const Value* v, int depth) {
  switch (v->kind) {
    case Kind::None: case Kind::Bool: case Kind::Int: case Kind::BigInt: case Kind::Float:
    case Kind::Str: case Kind::Bytes:
      return true;
    case Kind::Tuple:
      if (depth > 4) return false;
      for (const Value* x : v->items)
        if (!is_plain_value(x, depth + 1)) return false;
      return true;
    default: return false;
  }
}

// An object of a data class (or types.SimpleNamespace): a Namespace named by its class, whose
// attributes BUILD fills in.
Value* object_of(Document& doc, const std::string& cls) {
  Value* o = doc.namespace_();
  o->text = cls;
  return o;
}

}  // namespace

Value* make_global(Document& doc, const std::string& module, const std::string& name,
                   const std::string& where) {
  GlobalInfo info{};
  bool known = false;
  if (doc.distcp_classes && is_distcp_class(module, name)) {
    info.known = Known::PlainClass;
    known = true;
  }
  // torch.layout's pickled form (copyreg in torch/serialization.py): _get_layout('torch.strided').
  if (doc.distcp_classes && module == "torch.serialization" && name == "_get_layout") {
    info.known = Known::GetLayout;
    known = true;
  }
  MG_REQUIRE(known || classify(module, name, &info), where,
             "refers to the global '", module, ".", name,
             "', which a Megatron-LM checkpoint never uses; refusing to load this file (nothing "
             "was executed). Only tensors, storages, containers, argparse.Namespace, OrderedDict, "
             "NumPy RNG state and the enums and data classes of Megatron, Transformer Engine and "
             "torch.distributed (as names and values) are accepted");
  if (info.known == Known::TorchConstant) {  // torch.float8_e4m3fn, torch.strided, ...
    Value* v = doc.make(Kind::Enum);
    v->text = "torch";
    v->member = name;
    return v;
  }
  if (info.known == Known::TorchDType) {
    Value* v = doc.torch_dtype(info.dtype);
    v->is_bool = info.is_bool;
    return v;
  }
  Value* v = doc.make(Kind::Global);
  v->text = module + "." + name;
  v->integer = int64_t(info.known);
  v->dtype = info.dtype;
  v->is_bool = info.is_bool;
  return v;
}

Value* call_global(Document& doc, Value* f, Value* args, const std::string& where) {
  MG_REQUIRE(f->kind == Kind::Global, where, "REDUCE calls a ", f->describe(),
             " (corrupted pickle)");
  MG_REQUIRE(args->kind == Kind::Tuple, where, "REDUCE arguments are a ", args->describe());
  const std::vector<Value*>& a = args->items;
  auto bad = [&]() -> Value* {
    MG_THROW(where, f->text, " called with unexpected arguments (", args->describe(),
             "): not a PyTorch checkpoint as Megatron-LM writes it");
  };
  switch (known_of(f)) {
    case Known::OrderedDict: {
      Value* d = doc.dict(true);
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
      return doc.namespace_();
    case Known::RebuildTensorV2:
    case Known::RebuildTensor: {
      // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]])
      const bool v2 = known_of(f) == Known::RebuildTensorV2;
      if (a.size() < 4 || (v2 && a.size() != 6 && a.size() != 7) || (!v2 && a.size() != 4))
        return bad();
      if (a[0]->kind != Kind::Storage || a[1]->kind != Kind::Int) return bad();
      Value* t = doc.make(Kind::Tensor);
      t->storage = a[0];
      t->dtype = a[0]->dtype;
      t->is_bool = a[0]->is_bool;
      t->storage_offset = a[1]->integer;
      if (!int_tuple(a[2], &t->shape) || !int_tuple(a[3], &t->stride)) return bad();
      MG_REQUIRE(t->shape.size() == t->stride.size() && t->shape.size() <= 16 && t->storage_offset >= 0,
                 where, "a tensor with ", t->shape.size(), " sizes, ", t->stride.size(),
                 " strides and storage offset ", t->storage_offset, " (corrupted file)");
      return t;
    }
    case Known::RebuildParameter:  // (data, requires_grad, backward_hooks)
      if (a.size() != 3 || a[0]->kind != Kind::Tensor) return bad();
      return a[0];
    case Known::TorchSize:
      if (a.size() != 1 || (a[0]->kind != Kind::Tuple && a[0]->kind != Kind::List)) return bad();
      return doc.tuple(a[0]->items);
    case Known::CodecsEncode: {  // protocol 2's bytes: _codecs.encode(latin-1 text, 'latin1')
      if (a.size() != 2 || a[0]->kind != Kind::Str || a[1]->kind != Kind::Str ||
          (a[1]->text != "latin1" && a[1]->text != "latin-1"))
        return bad();
      Value* b = doc.make(Kind::Bytes);
      MG_REQUIRE(latin1_bytes(a[0]->text, &b->text), where,
                 "_codecs.encode of text that is not latin-1 (corrupted pickle)");
      return b;
    }
    case Known::Bytes: {
      Value* b = doc.make(Kind::Bytes);
      if (a.empty()) return b;
      if (a.size() == 1 && a[0]->kind == Kind::Bytes) {
        b->text = a[0]->text;
        return b;
      }
      return bad();
    }
    case Known::BytesIO: {  // (initial bytes[, position]), then BUILD with its __dict__
      Value* b = doc.make(Kind::Bytes);
      b->member = "BytesIO";
      if (a.empty()) return b;
      if (a.size() > 2 || a[0]->kind != Kind::Bytes) return bad();
      b->text = a[0]->text;
      return b;
    }
    case Known::Set:
      if (a.empty()) return doc.list();
      if (a.size() != 1 || (a[0]->kind != Kind::List && a[0]->kind != Kind::Tuple)) return bad();
      return doc.list(a[0]->items);
    case Known::NumpyReconstruct: {  // (numpy.ndarray, (0,), b'b'), then BUILD
      if (a.size() != 3 || a[0]->kind != Kind::Global || known_of(a[0]) != Known::NumpyNdarray)
        return bad();
      Value* v = doc.make(Kind::NdArray);
      v->member = "|u1";
      return v;
    }
    case Known::NumpyDType: {  // numpy.dtype('u4', False, True), then BUILD
      if (a.empty() || a.size() > 3 || a[0]->kind != Kind::Str) return bad();
      NumpyType t{};
      MG_REQUIRE(parse_numpy_type(a[0]->text, &t), where, "numpy.dtype('", a[0]->text.substr(0, 16),
                 "') is not an element type a Megatron checkpoint uses");
      Value* v = doc.make(Kind::NumpyDType);
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
        if (t.size == 8) return doc.real(std::bit_cast<double>(u));
        if (t.size == 4) return doc.real(std::bit_cast<float>(uint32_t(u)));
        return doc.real(fp16_to_float(fp16{uint16_t(u)}));
      }
      if (t.kind == 'b') return doc.boolean(u != 0);
      if (t.kind == 'i' && t.size < 8 && (u >> (8 * t.size - 1)) & 1) u |= ~uint64_t(0) << (8 * t.size);
      return doc.integer(int64_t(u));
    }
    case Known::Getattr: {  // getattr(EnumClass, 'member'): how Python 3.11+ pickles enums
      if (a.size() != 2 || a[0]->kind != Kind::Global || known_of(a[0]) != Known::PlainClass ||
          a[1]->kind != Kind::Str || a[1]->text.starts_with("__"))
        return bad();
      Value* e = doc.make(Kind::Enum);
      e->text = a[0]->text;
      e->member = a[1]->text;
      return e;
    }
    case Known::PlainClass: {
      // EnumClass(value); a data class rebuilt from its state; a named tuple's fields.
      if (a.empty()) return object_of(doc, f->text);
      for (const Value* x : a)
        if (!is_plain_value(x, 0)) return bad();
      if (a.size() > 1) return doc.tuple(a);
      Value* e = doc.make(Kind::Enum);
      e->text = f->text;
      e->items = {a[0]};
      return e;
    }
    case Known::GetLayout: {  // _get_layout('torch.strided') -> the layout's name
      if (a.size() != 1 || a[0]->kind != Kind::Str || !a[0]->text.starts_with("torch.")) return bad();
      const std::string layout = a[0]->text.substr(6);
      if (std::none_of(std::begin(kTorchConstants), std::end(kTorchConstants),
                       [&](const char* c) { return layout == c; }))
        return bad();
      Value* e = doc.make(Kind::Enum);
      e->text = "torch";
      e->member = layout;
      return e;
    }
    case Known::DefaultDict:  // defaultdict(factory): a dict (SETITEMS fills it)
      if (a.size() > 1 || (a.size() == 1 && a[0]->kind != Kind::None &&
                           (a[0]->kind != Kind::Global || known_of(a[0]) != Known::BuiltinType)))
        return bad();
      return doc.dict();
    case Known::SimpleNamespace:  // types.SimpleNamespace(), then BUILD with its attributes
      if (!a.empty()) return bad();
      return object_of(doc, "types.SimpleNamespace");
    case Known::Reconstructor: {  // copyreg._reconstructor(cls, object, None): protocols 0 and 1
      if (a.size() != 3 || a[0]->kind != Kind::Global || a[1]->kind != Kind::Global ||
          known_of(a[1]) != Known::Object || a[2]->kind != Kind::None)
        return bad();
      const Known k = known_of(a[0]);
      if (k == Known::Namespace) return doc.namespace_();
      if (k == Known::SimpleNamespace) return object_of(doc, "types.SimpleNamespace");
      if (k == Known::PlainClass) return object_of(doc, a[0]->text);
      return bad();
    }
    default: break;
  }
  MG_THROW(where, "calls ", f->text, ", which a PyTorch checkpoint never calls (corrupted pickle)");
}

Value* new_object(Document& doc, Value* cls, Value* args, const std::string& where) {
  MG_REQUIRE(cls->kind == Kind::Global && args->kind == Kind::Tuple &&
                 (args->items.empty() || known_of(cls) == Known::PlainClass),
             where, "NEWOBJ of ", cls->describe(), " with ", args->describe(),
             " (only argparse.Namespace, OrderedDict, io.BytesIO and plain data classes are built "
             "this way in checkpoints)");
  if (known_of(cls) == Known::PlainClass) return call_global(doc, cls, args, where);
  if (known_of(cls) == Known::SimpleNamespace) return object_of(doc, "types.SimpleNamespace");
  if (known_of(cls) == Known::Namespace) return doc.namespace_();
  if (known_of(cls) == Known::OrderedDict) return doc.dict(true);
  if (known_of(cls) == Known::BytesIO) {
    Value* b = doc.make(Kind::Bytes);
    b->member = "BytesIO";
    return b;
  }
  MG_THROW(where, "NEWOBJ of ", cls->text, " is not used by PyTorch checkpoints");
}

void build_object(Value* obj, Value* state, const std::string& where) {
  switch (obj->kind) {
    case Kind::Namespace: {
      // TensorProperties.__getstate__ (torch.distributed): the tuple of its five fields (dtype,
      // layout, requires_grad, memory_format, pin_memory), kept in `items`.
      if (obj->text.ends_with(".TensorProperties") && state->kind == Kind::Tuple &&
          state->items.size() == 5) {
        obj->items = state->items;
        return;
      }
      // state: the instance __dict__, or (dict or None, slot state)
      if (state->kind == Kind::Tuple && state->items.size() == 2)
        state = state->items[0]->kind == Kind::None ? state->items[1] : state->items[0];
      if (state->kind == Kind::None) return;
      MG_REQUIRE(state->kind == Kind::Dict, where,
                 obj->text.empty() ? std::string("argparse.Namespace") : obj->text, " state is a ",
                 state->describe());
      obj->entries.insert(obj->entries.end(), state->entries.begin(), state->entries.end());
      return;
    }
    case Kind::Bytes:  // an io.BytesIO's state (value, position, __dict__): the value is kept
      MG_REQUIRE(obj->member == "BytesIO", where, "BUILD on bytes (corrupted pickle)");
      if (state->kind == Kind::Tuple && !state->items.empty() && state->items[0]->kind == Kind::Bytes)
        obj->text = state->items[0]->text;
      return;
    case Kind::Dict:  // an OrderedDict's instance attributes (state_dict()._metadata): dropped
      MG_REQUIRE(obj->ordered, where, "BUILD on a plain dict (corrupted pickle)");
      return;
    case Kind::NumpyDType: {
      // (version, byte order, subarray, names, fields, elsize, alignment, flags)
      MG_REQUIRE(state->kind == Kind::Tuple && state->items.size() >= 2 &&
                     state->items[1]->kind == Kind::Str,
                 where, "numpy.dtype state is a ", state->describe());
      const std::string& order = state->items[1]->text;
      MG_REQUIRE(order == "<" || order == "|" || order == "=", where,
                 "big-endian NumPy data is not supported (byte order '", order.substr(0, 4), "')");
      obj->member[0] = order == "|" ? '|' : '<';
      return;
    }
    case Kind::NdArray: {
      // ([version,] shape, dtype, is_fortran, raw data)
      MG_REQUIRE(state->kind == Kind::Tuple && (state->items.size() == 4 || state->items.size() == 5),
                 where, "numpy.ndarray state is a ", state->describe());
      const size_t o = state->items.size() - 4;
      Value* dt = state->items[o + 1];
      Value* raw = state->items[o + 3];
      MG_REQUIRE(int_tuple(state->items[o], &obj->shape) && obj->shape.size() <= 8 &&
                     dt->kind == Kind::NumpyDType && state->items[o + 2]->kind == Kind::Bool &&
                     raw->kind == Kind::Bytes,
                 where, "malformed numpy.ndarray state");
      NumpyType t{};
      MG_CHECK(parse_numpy_type(dt->member, &t), "numpy dtype ", dt->member);
      uint64_t n = uint64_t(t.size);
      for (int64_t d : obj->shape) {
        MG_REQUIRE(d >= 0 && (d == 0 || n <= (uint64_t(1) << 62) / uint64_t(d)), where,
                   "numpy.ndarray of impossible shape");
        n *= uint64_t(d);
      }
      MG_REQUIRE(n == raw->text.size(), where, "numpy.ndarray of shape ", shape_str(obj->shape),
                 " and type ", dt->member, " holds ", raw->text.size(), " bytes, expected ", n);
      MG_REQUIRE(!state->items[o + 2]->boolean || obj->shape.size() <= 1, where,
                 "Fortran-ordered NumPy arrays are not supported");
      obj->member = dt->member;
      obj->text = raw->text;
      return;
    }
    default: break;
  }
  MG_THROW(where, "BUILD on a ", obj->describe(), ", which PyTorch checkpoints never do");
}

Value* storage_reference(Document& doc, Value* pid, const std::string& where) {
  // ('storage', storage type, key, location, numel) and, in PyTorch's legacy (pre-1.6) format,
  // a sixth item: view metadata (None).
  MG_REQUIRE(pid->kind == Kind::Tuple && (pid->items.size() == 5 || pid->items.size() == 6) &&
                 pid->items[0]->kind == Kind::Str && pid->items[0]->text == "storage",
             where, "persistent id ", pid->describe(), " is not a storage reference");
  const std::vector<Value*>& a = pid->items;
  MG_REQUIRE((a[1]->kind == Kind::Global && known_of(a[1]) == Known::Storage) ||
                 a[1]->kind == Kind::TorchDType,
             where, "storage of type ", a[1]->describe(), " (not a tensor storage)");
  MG_REQUIRE(a[2]->kind == Kind::Str && a[3]->kind == Kind::Str && a[4]->kind == Kind::Int &&
                 a[4]->integer >= 0,
             where, "malformed storage reference (key, location, size)");
  MG_REQUIRE(a.size() == 5 || a[5]->kind == Kind::None, where,
             "storage views (files of PyTorch before 0.4) are not supported");
  MG_REQUIRE(a[2]->text.size() <= 64, where, "over-long storage key");
  Value* s = doc.make(Kind::Storage);
  s->dtype = a[1]->dtype;
  s->is_bool = a[1]->is_bool;
  s->text = a[2]->text;
  s->location = a[3]->text.substr(0, 32);
  s->storage_numel = a[4]->integer;
  doc.storages.push_back(s);
  return s;
}

}  // namespace megatron::pickle::detail

namespace megatron::pickle {

bool is_allowed_global(const std::string& module, const std::string& name) {
  detail::GlobalInfo info{};
  return detail::classify(module, name, &info);
}

}  // namespace megatron::pickle
