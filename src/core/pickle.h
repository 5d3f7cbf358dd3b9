// A restricted Python pickle reader and a protocol-2 writer, for the data.pkl of PyTorch's
// checkpoints (torch.save) as Megatron-LM writes them. Nothing is ever executed: the reader is an
// interpreter of the pickle opcodes that builds a tree of plain values, and it knows a fixed set
// of globals, each of which it turns into a value of its own kind:
//
//   collections.OrderedDict()                        -> Dict (ordered = true; BUILD state ignored)
//   argparse.Namespace (NEWOBJ + BUILD dict)         -> Namespace (attributes in `entries`)
//   torch._utils._rebuild_tensor_v2 / _rebuild_tensor / _rebuild_parameter
//                                                    -> Tensor (storage key, dtype, offset, shape, stride)
//   persistent id ('storage', torch.<T>Storage, key, location, numel)
//                                                    -> Storage
//   torch.<T>Storage, torch.float16 and other torch dtypes
//                                                    -> TorchDType
//   numpy.core.multiarray._reconstruct + BUILD, numpy.dtype (numpy._core too)
//                                                    -> NdArray, NumpyDType (NumPy RNG state)
//   numpy.core.multiarray.scalar(dtype, bytes)       -> Int / Float
//   _codecs.encode(str, 'latin1'), builtins.bytes / bytearray
//                                                    -> Bytes (protocol 2's bytes)
//   builtins.set / frozenset (also __builtin__.*)    -> List
//   a CamelCase class of a megatron.*, transformer_engine.* or torch.distributed.* module named
//   "enums", or of the few others that hold checkpointed enums and data classes
//   (megatron.core.rerun_state_machine, ...; pickle_globals.cpp lists them): AttnBackend,
//   InferenceCudaGraphScope, RerunMode, Caller, ...; never called:
//     Class(value) with a plain value, or builtins.getattr(Class, member name)   -> Enum
//     Class() / NEWOBJ / copyreg._reconstructor(Class, object, None), + BUILD  -> Namespace
//                                                                     (text: "module.Class")
//     Class(a, b, ...) / NEWOBJ with plain values (a named tuple)          -> Tuple
//   types.SimpleNamespace() + BUILD (nested argument groups)  -> Namespace ("types.SimpleNamespace")
//   collections.defaultdict(builtins.int or another builtin type) -> Dict
//   torch.float8_e4m3fn and the other dtypes without an element type here, torch.strided,
//   torch.contiguous_format, ...                     -> Enum (text "torch", member: the name)
//   torch.Size(tuple)                                -> Tuple
//   io.BytesIO(bytes) + BUILD (older Transformer Engine _extra_state) -> Bytes
//
// Any other global (os.system, posix.system, builtins.eval, ...) is refused with an Error that
// names it, as are the opcodes only other pickles use (INST, OBJ, EXT*, PERSID text ids other than
// storages). Every size is bounded: strings and byte strings by the bytes left, the memo is a map
// (a huge index allocates nothing), containers grow one opcode at a time, objects, stack, memo and
// marks by kMaxPickleObjects, and the tree lives in an arena owned by the Document (memo
// references may form cycles and shared subtrees: consumers walk it with a depth limit).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace megatron::pickle {

// No pickle may build more objects (or hold more stack, memo or mark entries) than this: the
// memory a hostile file can claim stays bounded whatever its size.
inline constexpr size_t kMaxPickleObjects = size_t(1) << 21;

enum class Kind : uint8_t {
  None, Bool, Int, BigInt, Float, Str, Bytes, Tuple, List, Dict, Namespace, Global,
  Storage, Tensor, TorchDType, NumpyDType, NdArray, Enum,
};
const char* kind_name(Kind k);

struct Value {
  Kind kind = Kind::None;
  bool boolean = false;
  bool ordered = false;  // Dict: an OrderedDict
  int64_t integer = 0;
  double real = 0;
  // Str: UTF-8 text; Bytes: raw bytes; BigInt: little-endian two's complement; Global and Enum:
  // "module.name" of the class; Namespace: "" for argparse.Namespace, else the object's class;
  // Storage: the storage key; NdArray: the raw elements (C order).
  std::string text;
  // Enum: the member name (getattr form) or empty (value form: items[0]); NumpyDType and
  // NdArray: the NumPy type string with its byte order ("<u4", "|u1").
  std::string member;
  std::vector<Value*> items;                       // Tuple, List; Enum: [value]
  std::vector<std::pair<Value*, Value*>> entries;  // Dict (insertion order), Namespace attributes
  // Storage, Tensor (its storage), TorchDType: the element type.
  DType dtype = DType::F32;
  bool is_bool = false;           // torch.bool / numpy bool: read as U8
  int64_t storage_numel = 0;      // Storage: elements
  std::string location;           // Storage: "cpu", "cuda:0", ...
  Value* storage = nullptr;       // Tensor
  int64_t storage_offset = 0;     // Tensor: in elements
  Shape shape, stride;            // Tensor (stride in elements), NdArray (shape)
  Tensor data;                    // writer: a Tensor's contents

  bool is(Kind k) const { return kind == k; }
  // Dict / Namespace lookup (the last entry with an equal key; nullptr when absent or not a
  // mapping). Keys compare by value for Str and Int.
  const Value* get(std::string_view key) const;
  const Value* get(int64_t key) const;
  // "dict of 3 entries", "str 'abc'", ... for error messages (bounded length).
  std::string describe() const;
};

// A pickled object tree and the memory that holds it.
class Document {
 public:
  Document() = default;
  Document(Document&&) = default;
  Document& operator=(Document&&) = default;

  Value* root = nullptr;
  std::vector<Value*> storages;  // reader: every Storage reference, in order of appearance
  // Reader: also accept the private classes of PyTorch's distributed-checkpoint metadata
  // (unpickle_distcp_metadata).
  bool distcp_classes = false;
  Value* make(Kind k);
  // Builders for writers.
  Value* none() { return make(Kind::None); }
  Value* boolean(bool b);
  Value* integer(int64_t i);
  Value* real(double d);
  Value* str(std::string s);
  Value* tuple(std::vector<Value*> items);
  Value* list(std::vector<Value*> items = {});
  Value* dict(bool ordered = false);
  Value* namespace_();
  Value* tensor(const Tensor& t);  // written as a storage of its own
  Value* torch_dtype(DType t);
  // A NumPy array of `shape` with elements of NumPy type `descr` ("<u4") in `raw` (C order).
  Value* ndarray(std::string raw, std::string descr, Shape shape);
  // Appends key -> value to a Dict or Namespace.
  static void set(Value* mapping, Value* key, Value* value);
  void set(Value* mapping, std::string key, Value* value) { set(mapping, str(std::move(key)), value); }
  // Every value of kind `k` the document holds, in order of creation.
  std::vector<const Value*> values_of(Kind k) const;

 private:
  std::deque<Value> arena_;
};

// Interprets a pickle (the binary opcodes of protocols 1-5, restricted as above) up to its STOP
// opcode; `consumed` (when given) receives the bytes read. `label` names the file in errors.
Document unpickle(std::span<const uint8_t> bytes, const std::string& label,
                  size_t* consumed = nullptr);

// unpickle for the `.metadata` file of PyTorch's distributed checkpoint (Megatron's torch_dist
// format): the same rules, and on top of them, as plain data, the private classes that file holds:
// torch.distributed.checkpoint.filesystem._StorageInfo (a Namespace of relative_path, offset,
// length), the _MEM_FORMAT_ENCODING enum and TensorProperties' tuple state (dtype, layout,
// requires_grad, memory_format, pin_memory: the Namespace's `items`), torch.layout's pickled form
// torch.serialization._get_layout('torch.strided') (an Enum "torch" of that member), and
// megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata (Megatron-Core 0.15's root).
Document unpickle_distcp_metadata(std::span<const uint8_t> bytes, const std::string& label);

// The global names the reader accepts ("module.name"), for documentation and tests.
bool is_allowed_global(const std::string& module, const std::string& name);

// A protocol-2 pickle of `root` as torch.save writes it: dicts, OrderedDicts, lists, tuples,
// None, bools, ints, floats, strings, argparse.Namespace and the objects above (by their class),
// enums (by value or by name), torch dtypes, 1-D NumPy arrays and tensors; a Tuple whose text is
// "torch.Size" as torch.Size(tuple), an object (Namespace of a class) with `items` as BUILD with
// that tuple state (TensorProperties' __getstate__), torch.strided as torch.layout pickles it
// (torch.serialization._get_layout('torch.strided')). Each tensor gets a storage of its own, keyed "0", "1", ... in order of appearance:
// `storages` receives (key, contiguous tensor) for the archive's data/<key> records.
// protocol 4 (pickle.dump's default, which PyTorch's FileSystemWriter uses for .metadata): the same
// objects with SHORT_BINUNICODE strings, BINBYTES, memoized STACK_GLOBALs and 64 KiB frames.
std::vector<uint8_t> pickle(const Value& root, std::vector<std::pair<std::string, Tensor>>& storages,
                            int protocol = 2);

}  // namespace megatron::pickle
