// Reading PyTorch's distributed-checkpoint folders; see torch_dist_format.h.
#include "training/torch_dist_format.h"

#include <algorithm>

#include "core/error.h"
#include "core/pickle.h"
#include "core/torch_file.h"
#include "core/zip_archive.h"
#include "training/torch_dist_stream.h"

namespace megatron::training {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;

namespace {

// Elements of one tensor (or chunk) at most: 2^48, far above any checkpoint's and far below
// int64 overflow of byte counts.
constexpr int64_t kMaxElements = int64_t(1) << 48;

const Value& field(const Value& obj, const char* name, const std::string& what, const std::string& label) {
  const Value* v = obj.get(name);
  MG_REQUIRE(v != nullptr, label, ": ", what, " has no '", name, "' (not a PyTorch distributed-checkpoint "
             ".metadata, or a version this build does not read)");
  return *v;
}

Shape int_shape(const Value& v, const std::string& what, const std::string& label) {
  MG_REQUIRE(v.kind == Kind::Tuple || v.kind == Kind::List, label, ": ", what, " is a ", v.describe(),
             ", not a shape");
  MG_REQUIRE(v.items.size() <= 16, label, ": ", what, " has ", v.items.size(), " dimensions");
  Shape s;
  for (const Value* x : v.items) {
    MG_REQUIRE(x->kind == Kind::Int && x->integer >= 0, label, ": ", what, " holds ", x->describe(),
               " (dimensions and offsets are non-negative integers)");
    s.push_back(x->integer);
  }
  return s;
}

int64_t bounded_numel(const Shape& s, const std::string& what, const std::string& label) {
  int64_t n = 1;
  for (int64_t d : s) {
    MG_REQUIRE(d == 0 || n <= kMaxElements / d, label, ": ", what, " has the impossible shape ",
               shape_str(s), " (more than 2^48 elements)");
    n *= d;
  }
  return n;
}

std::string key_of(const Value& k, const std::string& label) {
  MG_REQUIRE(k.kind == Kind::Str, label, ": a state_dict_metadata key is a ", k.describe());
  MG_REQUIRE(!k.text.empty() && k.text.size() <= 4096, label, ": a state_dict_metadata key of ",
             k.text.size(), " characters");
  return k.text;
}

DType dtype_of(const Value& props, const std::string& key, const std::string& label) {
  // TensorProperties: its __getstate__ tuple (dtype, layout, requires_grad, memory format,
  // pin_memory) in `items`, or older torch's attributes.
  const Value* d = !props.items.empty() ? props.items[0] : props.get("dtype");
  MG_REQUIRE(d != nullptr && d->kind == Kind::TorchDType && !d->is_bool, label, ": tensor '", key,
             "' has dtype ", d ? d->describe() : std::string("(none)"),
             "; this build reads float32, float16, bfloat16, float64 and integer tensors");
  return d->dtype;
}

// Checks that the chunks of a tensor neither overlap nor leave a gap: the chunk boundaries cut
// each dimension into intervals, and every cell of that grid must lie in exactly one chunk. The
// work is bounded by the number of cells (at most kMaxCells), whatever a file claims.
constexpr int64_t kMaxCells = int64_t(1) << 24;

void check_tiling(const std::string& key, const Shape& size, const std::vector<DistcpChunk>& chunks,
                  const std::string& label) {
  const size_t nd = size.size();
  std::vector<std::vector<int64_t>> cuts(nd);
  int64_t cells = 1;
  for (size_t d = 0; d < nd; ++d) {
    std::vector<int64_t>& c = cuts[d];
    c = {0, size[d]};
    for (const DistcpChunk& ch : chunks) {
      c.push_back(ch.offsets[d]);
      c.push_back(ch.offsets[d] + ch.sizes[d]);
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    const int64_t n = std::max<int64_t>(int64_t(c.size()) - 1, 1);
    MG_REQUIRE(cells <= kMaxCells / n, label, ": the chunks of '", key, "' do not form a regular grid "
               "(more than 2^24 cells): not a checkpoint Megatron writes");
    cells *= n;
  }
  if (nd == 0) {
    MG_REQUIRE(chunks.size() == 1, label, ": the scalar '", key, "' has ", chunks.size(), " chunks, not one");
    return;
  }
  if (std::any_of(size.begin(), size.end(), [](int64_t x) { return x == 0; })) return;
  std::vector<uint8_t> seen(size_t(cells), 0);
  for (const DistcpChunk& ch : chunks) {
    std::vector<int64_t> lo(nd), hi(nd), at(nd);
    bool empty = false;
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), ch.offsets[d]) - cuts[d].begin();
      hi[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), ch.offsets[d] + ch.sizes[d]) - cuts[d].begin();
      empty = empty || lo[d] == hi[d];
      at[d] = lo[d];
    }
    if (empty) continue;
    while (true) {  // every cell of the chunk's box
      int64_t flat = 0;
      for (size_t d = 0; d < nd; ++d) flat = flat * (int64_t(cuts[d].size()) - 1) + at[d];
      MG_REQUIRE(!seen[size_t(flat)], label, ": chunks of '", key, "' overlap (the chunk at ",
                 shape_str(ch.offsets), " of size ", shape_str(ch.sizes), " covers elements another "
                 "chunk holds): a corrupted .metadata");
      seen[size_t(flat)] = 1;
      size_t d = nd;
      while (d > 0 && ++at[d - 1] == hi[d - 1]) {
        at[d - 1] = lo[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  MG_REQUIRE(std::all_of(seen.begin(), seen.end(), [](uint8_t x) { return x != 0; }), label,
             ": the chunks of '", key, "' do not cover its global shape ", shape_str(size),
             ": part of the tensor is missing (a rank's files were not saved or not copied?)");
}

}  // namespace

DistcpFolder DistcpFolder::open(const fs::path& dir) {
  DistcpFolder f;
  f.dir_ = dir;
  const std::string label = f.metadata_label();
  MG_REQUIRE(fs::is_regular_file(dir / ".metadata"), label, " does not exist: not a complete "
             "torch_dist checkpoint (an interrupted save, or a partial copy)");
  uint64_t total_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".distcp") {
      f.file_sizes_[e.path().filename().string()] = e.file_size();
      total_bytes += e.file_size();
    }
  const MappedFile m = map_file(dir / ".metadata", " (an empty .metadata: the save did not finish)");
  const pickle::Document doc = pickle::unpickle_distcp_metadata(m.bytes, label);
  const Value& root = *doc.root;
  MG_REQUIRE(root.kind == Kind::Namespace &&
                 (root.text.ends_with(".Metadata") || root.text.ends_with(".MCoreMetadata")),
             label, " holds a ", root.describe(), ", not torch.distributed.checkpoint's Metadata");
  const Value& sdm = field(root, "state_dict_metadata", "Metadata", label);
  const Value& storage = field(root, "storage_data", "Metadata", label);
  MG_REQUIRE(sdm.kind == Kind::Dict && storage.kind == Kind::Dict, label,
             ": state_dict_metadata and storage_data must be dicts");

  // Where each item lies: (fqn, chunk offsets or empty for bytes) -> item.
  std::map<std::pair<std::string, Shape>, DistcpItem> where;
  for (const auto& [k, v] : storage.entries) {
    MG_REQUIRE(k->kind == Kind::Namespace && k->text.ends_with(".MetadataIndex") && v->kind == Kind::Namespace &&
                   v->text.ends_with("._StorageInfo"),
               label, ": a storage_data entry maps ", k->describe(), " to ", v->describe(),
               " (expected MetadataIndex -> _StorageInfo)");
    const Value& fqn = field(*k, "fqn", "a MetadataIndex", label);
    MG_REQUIRE(fqn.kind == Kind::Str, label, ": a MetadataIndex fqn is a ", fqn.describe());
    const Value* off = k->get("offset");
    const Shape offsets = off == nullptr || off->kind == Kind::None
                              ? Shape{}
                              : int_shape(*off, "the offset of '" + fqn.text + "'", label);
    DistcpItem item;
    const Value& path = field(*v, "relative_path", "a _StorageInfo", label);
    const Value& o = field(*v, "offset", "a _StorageInfo", label);
    const Value& n = field(*v, "length", "a _StorageInfo", label);
    MG_REQUIRE(path.kind == Kind::Str && o.kind == Kind::Int && n.kind == Kind::Int && o.integer >= 0 &&
                   n.integer >= 0,
               label, ": the storage of '", fqn.text, "' is not (file name, offset >= 0, length >= 0)");
    if (const Value* t = v->get("transform_descriptors"); t != nullptr && !t->items.empty())
      MG_THROW(label, ": the item of '", fqn.text, "' is stored through transforms (compression?), "
               "which this build does not read; save with PyTorch's default writer");
    item.file = path.text;
    item.offset = uint64_t(o.integer);
    item.length = uint64_t(n.integer);
    MG_REQUIRE(item.file.find('/') == std::string::npos && item.file.find('\\') == std::string::npos &&
                   item.file != "." && item.file != ".." && !item.file.empty(),
               label, ": the item of '", fqn.text, "' names the file '", item.file.substr(0, 200),
               "', which is not a plain file name in the checkpoint folder");
    auto size = f.file_sizes_.find(item.file);
    MG_REQUIRE(size != f.file_sizes_.end(), label, ": the item of '", fqn.text, "' is in ", item.file,
               ", which is not in ", dir.string(), " (an incomplete copy?)");
    MG_REQUIRE(item.offset <= size->second && item.length <= size->second - item.offset, label,
               ": the item of '", fqn.text, "' lies at bytes ", item.offset, " + ", item.length, " of ",
               item.file, ", which has ", size->second, " bytes (a truncated or corrupted file)");
    MG_REQUIRE(where.emplace(std::make_pair(fqn.text, offsets), item).second, label, ": two items of '",
               fqn.text, "' at offsets ", shape_str(offsets));
  }

  for (const auto& [k, v] : sdm.entries) {
    const std::string key = key_of(*k, label);
    MG_REQUIRE(v->kind == Kind::Namespace, label, ": '", key, "' is described by a ", v->describe());
    DistcpEntry e;
    if (v->text.ends_with(".BytesStorageMetadata")) {
      e.is_bytes = true;
      auto it = where.find({key, Shape{}});
      MG_REQUIRE(it != where.end(), label, ": the bytes item '", key, "' has no storage entry");
      e.item = it->second;
      f.entries_.emplace(key, std::move(e));
      continue;
    }
    MG_REQUIRE(v->text.ends_with(".TensorStorageMetadata"), label, ": '", key, "' is described by a ",
               v->text, ", not TensorStorageMetadata or BytesStorageMetadata");
    e.dtype = dtype_of(field(*v, "properties", "a TensorStorageMetadata", label), key, label);
    e.size = int_shape(field(*v, "size", "a TensorStorageMetadata", label), "the size of '" + key + "'", label);
    const int64_t numel = bounded_numel(e.size, "tensor '" + key + "'", label);
    MG_REQUIRE(uint64_t(numel) <= total_bytes / dtype_size(e.dtype), label, ": tensor '", key,
               "' has the global shape ", shape_str(e.size), ", more bytes than all ", total_bytes,
               " bytes of the folder's .distcp files (a corrupted .metadata)");
    const Value& chunks = field(*v, "chunks", "a TensorStorageMetadata", label);
    MG_REQUIRE(chunks.kind == Kind::List, label, ": the chunks of '", key, "' are a ", chunks.describe());
    for (const Value* c : chunks.items) {
      MG_REQUIRE(c->kind == Kind::Namespace, label, ": a chunk of '", key, "' is a ", c->describe());
      DistcpChunk ch;
      ch.offsets = int_shape(field(*c, "offsets", "a ChunkStorageMetadata", label),
                             "a chunk offset of '" + key + "'", label);
      ch.sizes = int_shape(field(*c, "sizes", "a ChunkStorageMetadata", label),
                           "a chunk size of '" + key + "'", label);
      MG_REQUIRE(ch.offsets.size() == e.size.size() && ch.sizes.size() == e.size.size(), label,
                 ": a chunk of '", key, "' has ", ch.offsets.size(), "-d offsets and ", ch.sizes.size(),
                 "-d sizes for a ", e.size.size(), "-d tensor");
      for (size_t d = 0; d < e.size.size(); ++d)
        MG_REQUIRE(ch.offsets[d] <= e.size[d] && ch.sizes[d] <= e.size[d] - ch.offsets[d], label,
                   ": the chunk of '", key, "' at ", shape_str(ch.offsets), " of size ", shape_str(ch.sizes),
                   " lies outside its global shape ", shape_str(e.size));
      auto it = where.find({key, ch.offsets});
      MG_REQUIRE(it != where.end(), label, ": the chunk of '", key, "' at ", shape_str(ch.offsets),
                 " has no storage entry (no file holds it)");
      ch.item = it->second;
      e.chunks.push_back(std::move(ch));
    }
    check_tiling(key, e.size, e.chunks, label);
    f.entries_.emplace(key, std::move(e));
  }
  return f;
}

const DistcpEntry& DistcpFolder::entry(const std::string& key) const {
  auto it = entries_.find(key);
  MG_REQUIRE(it != entries_.end(), metadata_label(), " has no entry '", key, "'");
  return it->second;
}

std::vector<uint8_t> DistcpFolder::read_item(const DistcpItem& item, const std::string& key) const {
  const fs::path file = dir_ / item.file;
  const MappedFile m = map_file(file, " (an empty .distcp file)");
  MG_REQUIRE(item.offset <= m.bytes.size() && item.length <= m.bytes.size() - item.offset, file.string(),
             ": the item of '", key, "' at bytes ", item.offset, " + ", item.length, " lies past its end (",
             m.bytes.size(), " bytes: the file changed or was truncated)");
  const auto* p = m.bytes.data() + item.offset;
  return std::vector<uint8_t>(p, p + item.length);
}

Tensor DistcpFolder::tensor(const std::string& key) const {
  const DistcpEntry& e = entry(key);
  MG_REQUIRE(!e.is_bytes, metadata_label(), ": '", key, "' is a bytes item, not a tensor");
  Tensor out = Tensor::empty(e.size, e.dtype);
  read_distcp_region(*this, key, Shape(e.size.size(), 0), out);  // chunk by chunk (torch_dist_stream.h)
  return out;
}

std::vector<uint8_t> DistcpFolder::bytes(const std::string& key) const {
  const DistcpEntry& e = entry(key);
  MG_REQUIRE(e.is_bytes, metadata_label(), ": '", key, "' is a tensor, not a bytes item");
  return read_item(e.item, key);
}

}  // namespace megatron::training
