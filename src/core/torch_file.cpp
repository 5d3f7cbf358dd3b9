// PyTorch file reading and writing; see torch_file.h.
#include "core/torch_file.h"

#include <cstring>

#include "core/error.h"
#include "core/input_bounds.h"

namespace megatron {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;

namespace {

constexpr uint8_t kZipMagic[4] = {'P', 'K', 3, 4};
// The legacy format's first pickle: PROTO 2, LONG1 of 10 bytes (0x1950a86a20f9469cfc6c).
constexpr uint8_t kLegacyMagic[13] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                      0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50};

// `n` elements of `elem` bytes, or false on overflow.
bool byte_count(int64_t n, size_t elem, uint64_t* out) {
  if (n < 0 || uint64_t(n) > (uint64_t(1) << 60) / elem) return false;
  *out = uint64_t(n) * elem;
  return true;
}

// A tensor's element count and the largest storage element it reaches, checked against its
// storage with overflow-checked arithmetic (sizes, strides and offsets come from the file).
struct Extent {
  uint64_t numel = 0, last = 0;
};
Extent tensor_extent(const Value& v, const std::string& label) {
  const int nd = int(v.shape.size());
  uint64_t numel = 1, last = uint64_t(v.storage_offset);
  bool fits = v.storage_offset >= 0 && int(v.stride.size()) == nd;
  for (int d = 0; d < nd && fits; ++d) {
    const int64_t n = v.shape[size_t(d)], st = v.stride[size_t(d)];
    uint64_t reach = 0;
    fits = n >= 0 && st >= 0 && !__builtin_mul_overflow(numel, uint64_t(n), &numel) &&
           (n == 0 || (!__builtin_mul_overflow(uint64_t(n - 1), uint64_t(st), &reach) &&
                       !__builtin_add_overflow(last, reach, &last)));
  }
  uint64_t bytes = 0;
  MG_REQUIRE(fits && checked_shape_bytes(v.shape, dtype_size(v.dtype), &bytes), label,
             ": a tensor has size ", shape_str(v.shape), ", strides ", shape_str(v.stride),
             " and offset ", v.storage_offset, ", whose element count or extent overflows 64 "
             "bits (corrupted file)");
  // A checkpoint's tensor never has more elements than its storage (only broadcast views do): a
  // tensor read from the file is bounded by the file's size.
  const uint64_t have = uint64_t(v.storage->storage_numel);
  MG_REQUIRE(numel <= have, label, ": a tensor of shape ", shape_str(v.shape),
             " has more elements than its storage '", v.storage->text, "' (", have,
             "): a broadcast view, or a corrupted file");
  MG_REQUIRE(numel == 0 || last < have, label, ": a tensor of shape ", shape_str(v.shape),
             " at offset ", v.storage_offset, " with strides ", shape_str(v.stride),
             " reaches element ", last, " of storage '", v.storage->text, "', which has ", have,
             " (corrupted file)");
  return {numel, last};
}

// Every tensor of the document checked against its storage, before any is trusted.
void check_tensor_extents(const pickle::Document& doc, const std::string& label) {
  for (const Value* t : doc.values_of(Kind::Tensor))
    if (t->storage != nullptr) (void)tensor_extent(*t, label);
}

}  // namespace

TorchFile TorchFile::open(const fs::path& file) {
  MappedFile m = map_file(file, "truncated or never completely written");
  TorchFile f = from_memory(m.bytes, file.string());
  f.keep_alive_ = std::move(m.mapping);
  return f;
}

TorchFile TorchFile::from_memory(std::span<const uint8_t> bytes, const std::string& label) try {
  TorchFile f;
  f.label_ = label;
  f.bytes_ = bytes;
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kZipMagic, 4) == 0) {
    f.open_zip();
  } else if (bytes.size() >= sizeof kLegacyMagic &&
             std::memcmp(bytes.data(), kLegacyMagic, sizeof kLegacyMagic) == 0) {
    f.open_legacy();
  } else {
    const bool tar = bytes.size() >= 263 && std::memcmp(bytes.data() + 257, "ustar", 5) == 0;
    MG_THROW(label, tar ? " is a tar archive: PyTorch's oldest checkpoint format (before 0.4) is "
                          "not supported; re-save it with a newer PyTorch"
                        : " is not a PyTorch checkpoint (neither the zip format nor the legacy "
                          "pickle format; truncated, corrupted, or another kind of file)");
  }
  return f;
} MG_CATCH_OUT_OF_MEMORY(label)

void TorchFile::open_zip() {
  zip_ = std::make_shared<ZipReader>(ZipReader::from_memory(bytes_, label_));
  const auto& entries = zip_->entries();
  MG_REQUIRE(!entries.empty(), label_, ": the archive has no entries");
  // The records sit in one top-level folder, named after the file it was first saved as.
  const std::string& first = entries.front().name;
  const size_t slash = first.find('/');
  MG_REQUIRE(slash != std::string::npos && slash > 0, label_, ": entry '", first.substr(0, 80),
             "' is not inside an archive folder (not a PyTorch checkpoint)");
  prefix_ = first.substr(0, slash + 1);
  const ZipEntry* pkl = zip_->find(prefix_ + "data.pkl");
  MG_REQUIRE(pkl != nullptr, label_, ": no ", prefix_, "data.pkl record (not a PyTorch checkpoint, or "
             "an incomplete file)");
  if (const ZipEntry* order = zip_->find(prefix_ + "byteorder")) {
    const auto b = zip_->read(*order);
    MG_REQUIRE(std::string(b.begin(), b.end()) == "little", label_,
               ": big-endian PyTorch files are not supported");
  }
  doc_ = pickle::unpickle(zip_->read(*pkl), label_ + " (" + prefix_ + "data.pkl)");
  // Every storage present and sized now; CRC-32 checked when a tensor is read.
  for (const Value* s : doc_.storages) (void)storage_bytes(*s, false);
  check_tensor_extents(doc_, label_);
}

void TorchFile::open_legacy() {
  size_t pos = 0;
  auto next = [&](const char* what) {
    size_t used = 0;
    pickle::Document d =
        pickle::unpickle(bytes_.subspan(pos), str(label_, " (legacy format, ", what, ")"), &used);
    pos += used;
    return d;
  };
  next("magic number");
  const pickle::Document version = next("protocol version");
  MG_REQUIRE(version.root->kind == Kind::Int && version.root->integer == 1001, label_,
             ": legacy PyTorch protocol version ", version.root->describe(), " (1001 expected)");
  const pickle::Document info = next("system info");
  const Value* little = info.root->get("little_endian");
  MG_REQUIRE(little == nullptr || (little->kind == Kind::Bool && little->boolean), label_,
             ": big-endian PyTorch files are not supported");
  doc_ = next("object");
  const pickle::Document keys = next("storage keys");
  MG_REQUIRE(keys.root->kind == Kind::List, label_, ": malformed legacy storage key list");
  std::map<std::string, const Value*> by_key;
  for (const Value* s : doc_.storages) by_key.emplace(s->text, s);
  for (const Value* k : keys.root->items) {
    MG_REQUIRE(k->kind == Kind::Str && by_key.count(k->text), label_,
               ": the legacy storage list names a storage the object does not use");
    MG_REQUIRE(bytes_.size() - pos >= 8, label_, ": truncated (storage '", k->text, "' is missing)");
    int64_t numel = 0;
    std::memcpy(&numel, bytes_.data() + pos, 8);
    pos += 8;
    const Value* s = by_key.at(k->text);
    uint64_t n = 0;
    MG_REQUIRE(numel == s->storage_numel && byte_count(numel, dtype_size(s->dtype), &n), label_,
               ": storage '", k->text, "' holds ", numel, " elements but the object says ",
               s->storage_numel, " (corrupted file)");
    MG_REQUIRE(n <= bytes_.size() - pos, label_, ": truncated inside storage '", k->text, "'");
    MG_REQUIRE(legacy_storages_.emplace(k->text, bytes_.subspan(pos, size_t(n))).second, label_,
               ": storage '", k->text, "' is listed twice");
    pos += size_t(n);
  }
  for (const Value* s : doc_.storages) (void)storage_bytes(*s, false);
  check_tensor_extents(doc_, label_);
}

std::span<const uint8_t> TorchFile::storage_bytes(const Value& s, bool verify) const {
  MG_CHECK(s.kind == Kind::Storage, "storage_bytes of a ", pickle::kind_name(s.kind));
  uint64_t expected = 0;
  MG_REQUIRE(byte_count(s.storage_numel, dtype_size(s.dtype), &expected), label_, ": storage '",
             s.text, "' has an impossible size");
  std::span<const uint8_t> data;
  if (zip_) {
    auto hit = checked_.find(s.text);
    if (hit != checked_.end()) {
      data = hit->second;
    } else {
      const ZipEntry* e = zip_->find(prefix_ + "data/" + s.text);
      MG_REQUIRE(e != nullptr, label_, ": storage record ", prefix_, "data/", s.text,
                 " is missing (incomplete or corrupted file)");
      if (verify) {
        data = zip_->read(*e);
        checked_.emplace(s.text, data);
      } else {
        MG_REQUIRE(e->size == expected, label_, ": storage record ", e->name, " has ", e->size,
                   " bytes but ", s.storage_numel, " ", dtype_name(s.dtype), " elements need ",
                   expected, " (corrupted file)");
        return {};
      }
    }
  } else {
    auto it = legacy_storages_.find(s.text);
    MG_REQUIRE(it != legacy_storages_.end(), label_, ": storage '", s.text, "' has no data");
    data = it->second;
  }
  MG_REQUIRE(data.size() == expected, label_, ": storage '", s.text, "' has ", data.size(),
             " bytes but ", s.storage_numel, " ", dtype_name(s.dtype), " elements need ", expected,
             " (corrupted file)");
  return data;
}

Tensor TorchFile::tensor(const Value& v) const try {
  MG_CHECK(v.kind == Kind::Tensor && v.storage != nullptr, "TorchFile::tensor of a ",
           pickle::kind_name(v.kind));
  const std::span<const uint8_t> data = storage_bytes(*v.storage, true);
  const size_t elem = dtype_size(v.dtype);
  const int nd = int(v.shape.size());
  const auto [numel, last] = tensor_extent(v, label_);
  Tensor out = Tensor::empty(v.shape, v.dtype);
  if (numel == 0) return out;
  const uint8_t* src = data.data();
  uint8_t* dst = static_cast<uint8_t*>(out.raw_data());
  if (Shape(v.stride) == contiguous_strides(v.shape)) {
    std::memcpy(dst, src + size_t(v.storage_offset) * elem, size_t(numel) * elem);
    return out;
  }
  // A strided view: walk the index odometer (innermost dimension as a run when it is dense).
  std::vector<int64_t> idx(size_t(nd), 0);
  const bool inner_dense = nd > 0 && v.stride[size_t(nd - 1)] == 1;
  const int64_t run = inner_dense ? v.shape[size_t(nd - 1)] : 1;
  const int outer = inner_dense ? nd - 1 : nd;
  for (uint64_t done = 0; done < numel; done += uint64_t(run)) {
    int64_t at = v.storage_offset;
    for (int d = 0; d < outer; ++d) at += idx[size_t(d)] * v.stride[size_t(d)];
    std::memcpy(dst + done * elem, src + size_t(at) * elem, size_t(run) * elem);
    for (int d = outer - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < v.shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return out;
} MG_CATCH_OUT_OF_MEMORY(label_)

void write_torch_file(const fs::path& file, const Value& root, const std::string& archive_name) {
  std::vector<std::pair<std::string, Tensor>> storages;
  const std::vector<uint8_t> pkl = pickle::pickle(root, storages);
  ZipWriter zip(file);
  const std::string p = archive_name + "/";
  zip.add(p + "data.pkl", pkl);
  static const std::string little = "little";
  zip.add(p + "byteorder", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(little.data()),
                                                    little.size()));
  for (const auto& [key, t] : storages)
    zip.add(p + "data/" + key,
            std::span<const uint8_t>(static_cast<const uint8_t*>(t.raw_data()), t.nbytes()));
  static const std::string version = "3\n";
  zip.add(p + "version", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(version.data()),
                                                  version.size()));
  zip.finish();
}

}  // namespace megatron
