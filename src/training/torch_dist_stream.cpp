// Streaming reads of torch_dist checkpoints; see torch_dist_stream.h.
#include "training/torch_dist_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/torch_file.h"
#include "core/zip_archive.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_moe.h"

namespace megatron::training {

namespace {

// Bytes of a chunk's storage read at a time: whole rows of the chunk's axis 0, at least one.
constexpr uint64_t kBlockBytes = uint64_t(8) << 20;

// Reads `n` bytes at `offset` of an open file.
void pread_all(int fd, uint8_t* to, uint64_t n, uint64_t offset, const std::filesystem::path& file) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, to, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
    MG_REQUIRE(got > 0, file.string(), ": cannot read ", n, " bytes at ", offset, " (",
               got == 0 ? std::string("the file is shorter than .metadata says") : std::strerror(errno), ")");
    to += got;
    n -= uint64_t(got);
    offset += uint64_t(got);
  }
}

// Copies the part of chunk `c` (rows [r0, r0 + rows) of axis 0, in `rows_t`) that lies in the
// region [lo, lo + n) into dest, whose first `fixed` axes of the region are fixed indices (see
// read_distcp_region's `leading`).
void copy_part(const Tensor& rows_t, int64_t r0, const DistcpChunk& c, const Shape& lo, const Shape& n,
               Tensor dest, size_t fixed) {
  const size_t nd = lo.size();
  Tensor src = rows_t, dst = dest;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t from = c.offsets[d] + (d == 0 ? r0 : 0), count = d == 0 ? rows_t.size(0) : c.sizes[d];
    const int64_t a = std::max(lo[d], from), b = std::min(lo[d] + n[d], from + count);
    if (a >= b) return;
    src = src.narrow(int(d), a - from, b - a);
    if (d >= fixed) dst = dst.narrow(int(d - fixed), a - lo[d], b - a);
  }
  for (size_t d = 0; d < fixed; ++d) src = src.select(0, 0);
  dst.copy_(src);
}

// Reads chunk `c` of `key` into the region [lo, lo + n) of dest: the item's archive and pickle
// read from the mapped file (a few pages), the storage streamed with pread in blocks of rows,
// its CRC-32 checked, each block's rows in the region copied into dest. Never more than one
// block of the chunk in memory.
void read_chunk_into(const DistcpFolder& f, const std::string& key, const DistcpEntry& e, const DistcpChunk& c,
                     const Shape& lo, const Shape& n, Tensor dest, size_t fixed) {
  const std::filesystem::path file = f.dir() / c.item.file;
  const MappedFile m = map_file(file, " (an empty .distcp file)");
  MG_REQUIRE(c.item.offset <= m.bytes.size() && c.item.length <= m.bytes.size() - c.item.offset, file.string(),
             ": the item of '", key, "' at bytes ", c.item.offset, " + ", c.item.length, " lies past its end (",
             m.bytes.size(), " bytes: the file changed or was truncated)");
  const std::string label = file.string() + " (item of '" + key + "' at " + shape_str(c.offsets) + ")";
  const std::span<const uint8_t> item = m.bytes.subspan(c.item.offset, c.item.length);
  const TorchFile tf = TorchFile::from_memory(item, label);
  const pickle::Value& v = tf.root();
  MG_REQUIRE(v.kind == pickle::Kind::Tensor, label, " holds a ", v.describe(), ", not a tensor");
  MG_REQUIRE(v.dtype == e.dtype && !v.is_bool, label, " is ", dtype_name(v.dtype), " but .metadata records ",
             dtype_name(e.dtype));
  MG_REQUIRE(v.shape == c.sizes, label, " has shape ", shape_str(v.shape), " but .metadata records the chunk as ",
             shape_str(c.sizes));
  const ZipReader zip = ZipReader::from_memory(item, label);
  const ZipEntry* storage = nullptr;
  if (v.storage != nullptr)
    for (const ZipEntry& z : zip.entries())
      if (z.name.ends_with("/data/" + v.storage->text)) storage = &z;
  const uint64_t elem = dtype_size(e.dtype), numel = uint64_t(shape_numel(c.sizes));
  if (c.sizes.empty() || storage == nullptr || Shape(v.stride) != contiguous_strides(v.shape) ||
      v.storage_offset < 0) {  // a scalar or a strided view (small): read whole
    copy_part(tf.tensor(v), 0, c, lo, n, dest, fixed);
    return;
  }
  const uint64_t begin = uint64_t(v.storage_offset) * elem;
  MG_REQUIRE(begin <= storage->size && numel * elem <= storage->size - begin, label, ": the tensor of ",
             numel, " elements at element ", v.storage_offset, " lies outside its storage of ", storage->size,
             " bytes");
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  MG_REQUIRE(fd >= 0, file.string(), ": cannot be opened (", std::strerror(errno), ")");
  const std::shared_ptr<void> closer(nullptr, [fd](void*) { ::close(fd); });
  const uint64_t at = c.item.offset + storage->data_offset;  // the storage's first byte in the file
  uint32_t crc = 0;
  std::vector<uint8_t> edge;
  auto crc_only = [&](uint64_t from, uint64_t count) {  // storage bytes outside the tensor
    for (uint64_t done = 0; done < count;) {
      edge.resize(size_t(std::min<uint64_t>(count - done, kBlockBytes)));
      pread_all(fd, edge.data(), edge.size(), at + from + done, file);
      crc = crc32(edge, crc);
      done += edge.size();
    }
  };
  crc_only(0, begin);
  const int64_t rows = c.sizes[0];
  const uint64_t row_bytes = rows > 0 ? numel * elem / uint64_t(rows) : 0;
  const int64_t per_block = row_bytes == 0 ? std::max<int64_t>(rows, 1)
                                           : std::max<int64_t>(1, int64_t(kBlockBytes / row_bytes));
  Shape block_shape = c.sizes;
  block_shape[0] = std::min(per_block, rows);
  Tensor block = Tensor::empty(block_shape, e.dtype);
  for (int64_t r0 = 0; r0 < rows; r0 += per_block) {
    const int64_t k = std::min(per_block, rows - r0);
    Tensor part = block.narrow(0, 0, k);
    auto* p = static_cast<uint8_t*>(part.raw_data());
    pread_all(fd, p, uint64_t(k) * row_bytes, at + begin + uint64_t(r0) * row_bytes, file);
    crc = crc32(std::span<const uint8_t>(p, size_t(uint64_t(k) * row_bytes)), crc);
    copy_part(part, r0, c, lo, n, dest, fixed);
  }
  crc_only(begin + numel * elem, storage->size - begin - numel * elem);
  MG_REQUIRE(crc == storage->crc32, label, ": entry '", storage->name, "' fails its CRC-32 check (the file is "
             "corrupted): expected ", storage->crc32, ", got ", crc);
}

// The dtype of a source (a gated pair's halves must agree).
DType source_dtype(const DistcpFolder& f, const std::string& prefix, const TorchDistSource& s) {
  const std::string k = prefix + s.key;
  if (f.has(k)) return f.entry(k).dtype;
  const DType w = f.entry(k + "_w").dtype, v = f.entry(k + "_v").dtype;
  MG_REQUIRE(w == v, f.metadata_label(), ": '", k, "_w' is ", dtype_name(w), " but '", k, "_v' is ",
             dtype_name(v));
  return w;
}

// The region of a source (our coordinates: leading axes removed, a gated pair's halves stacked
// along axis 0) at `offsets` with dest's shape.
void read_source_region(const DistcpFolder& f, const std::string& prefix, const TorchDistSource& s,
                        const Shape& offsets, Tensor dest) {
  const std::string k = prefix + s.key;
  if (f.has(k)) return read_distcp_region(f, k, offsets, dest, s.index);
  const int64_t W = f.entry(k + "_w").size[s.index.size()];
  const int64_t lo = offsets[0], n = dest.size(0);
  if (lo < W) read_distcp_region(f, k + "_w", offsets, dest.narrow(0, 0, std::min(n, W - lo)), s.index);
  if (lo + n > W) {
    const int64_t start = std::max(lo, W);
    Shape up = offsets;
    up[0] = start - W;
    read_distcp_region(f, k + "_v", up, dest.narrow(0, start - lo, lo + n - start), s.index);
  }
}

}  // namespace

void read_distcp_region(const DistcpFolder& f, const std::string& key, const Shape& offsets, Tensor dest,
                        const Shape& leading) {
  const DistcpEntry& e = f.entry(key);
  const std::string label = f.metadata_label();
  MG_REQUIRE(!e.is_bytes, label, ": '", key, "' is a bytes item, not a tensor");
  Shape lo = leading, n(leading.size(), 1);
  lo.insert(lo.end(), offsets.begin(), offsets.end());
  n.insert(n.end(), dest.shape().begin(), dest.shape().end());
  const size_t nd = e.size.size();
  MG_REQUIRE(lo.size() == nd && n.size() == nd, label, ": '", key, "' is ", nd, "-d (", shape_str(e.size),
             ") but is read as ", n.size(), "-d (", shape_str(n), ")");
  for (size_t d = 0; d < nd; ++d)
    MG_REQUIRE(lo[d] >= 0 && n[d] >= 0 && lo[d] <= e.size[d] && n[d] <= e.size[d] - lo[d], label, ": the region at ",
               shape_str(lo), " of size ", shape_str(n), " lies outside '", key, "' of global shape ",
               shape_str(e.size));
  MG_CHECK(dest.dtype() == e.dtype, "read_distcp_region: dest is ", dtype_name(dest.dtype()), ", '", key, "' ",
           dtype_name(e.dtype));
  if (shape_numel(n) == 0) return;
  for (const DistcpChunk& c : e.chunks) {
    bool meets = true;
    for (size_t d = 0; d < nd; ++d)
      meets = meets && std::max(lo[d], c.offsets[d]) < std::min(lo[d] + n[d], c.offsets[d] + c.sizes[d]);
    if (meets) read_chunk_into(f, key, e, c, lo, n, dest, leading.size());
  }
}

Shape source_shape(const DistcpFolder& f, const std::string& prefix, const TorchDistSource& s) {
  const std::string k = prefix + s.key, label = f.metadata_label();
  const size_t ax = s.index.size();  // the first axis after the leading ones
  Shape shape;
  if (f.has(k)) {
    shape = f.entry(k).size;
  } else {
    shape = f.entry(k + "_w").size;
    const Shape& v = f.entry(k + "_v").size;
    bool same = shape.size() == v.size() && shape.size() > ax;
    for (size_t d = 0; same && d < shape.size(); ++d) same = d == ax || shape[d] == v[d];
    MG_REQUIRE(same, label, ": '", k, "_w' and '_v' have shapes ", shape_str(shape), " and ", shape_str(v),
               ", which do not stack along axis ", ax);
    shape[ax] += v[ax];
  }
  MG_REQUIRE(shape.size() >= ax, label, ": '", k, "' of shape ", shape_str(shape), " has no index ",
             shape_str(s.index), " on its leading axes");
  for (size_t d = 0; d < ax; ++d)
    MG_REQUIRE(s.index[d] >= 0 && s.index[d] < shape[d], label, ": '", k, "' of shape ", shape_str(shape),
               " has no index ", shape_str(s.index), " on its leading axes");
  shape.erase(shape.begin(), shape.begin() + std::ptrdiff_t(ax));
  return shape;
}

Tensor read_source(const DistcpFolder& f, const std::string& prefix, const TorchDistSource& s) {
  const Shape shape = source_shape(f, prefix, s);
  Tensor out = Tensor::empty(shape, source_dtype(f, prefix, s));
  read_source_region(f, prefix, s, Shape(shape.size(), 0), out);
  return out;
}

void stream_torch_dist_shards(const CheckpointOnDisk& ckpt, const std::map<std::string, Shape>& params,
                              const CheckpointRank& rank, const std::string& prefix, bool zero_fill_rows,
                              const std::function<void(const std::string&, const Tensor&)>& sink) {
  const DistcpFolder f = DistcpFolder::open(ckpt.dir);
  const std::map<std::string, TorchDistSource> sources =
      torch_dist_sources(ckpt, f, prefix, [&](const std::string& n) { return params.count(n) > 0; });
  const std::map<std::string, model::WeightSpec> specs = checkpoint_weight_specs(ckpt, nlohmann::json());
  for (const auto& [name, shape] : params) {
    const auto [tp_rank, T] = torch_dist_moe::tensor_split(rank, name);  // an expert's: over ETP
    auto src = sources.find(name);
    if (src == sources.end()) continue;  // the caller names what is missing
    auto spec = specs.find(name);
    if (spec == specs.end() && prefix.empty() && torch_dist_moe::is_expert_bias(name)) {
      // The router's expert_bias: whole on every rank, a float32 buffer in Megatron, float64 here.
      sink(name, read_source(f, prefix, src->second).to(DType::F64));
      continue;
    }
    MG_REQUIRE(spec != specs.end(), ckpt.dir.string(), ": tensor '", name, "' is not a parameter of the "
               "model the checkpoint's args describe");
    const ShardRule rule = shard_rule(spec->second);
    const Shape global = source_shape(f, prefix, src->second);
    Tensor t;
    if (rule.vocab && !shape.empty() && !global.empty() && global[0] != shape[0] * (rule.dim == 0 ? T : 1)) {
      // Another padded vocabulary: the table re-padded whole, then cut.
      t = repad_rows(read_source(f, prefix, src->second), shape[0] * (rule.dim == 0 ? T : 1), zero_fill_rows);
      t = split_shard(t, rule, tp_rank, T);
    } else if (rule.dim < 0 || T == 1) {
      t = read_source(f, prefix, src->second);
    } else {
      MG_REQUIRE(size_t(rule.dim) < global.size() && global[size_t(rule.dim)] % (int64_t(T) * rule.parts) == 0,
                 f.metadata_label(), ": '", prefix + src->second.key, "' (", name, ", global shape ",
                 shape_str(global), ") cannot be split into ", T, " tensor-parallel shards along dimension ",
                 rule.dim, rule.parts > 1 ? str(" in each of its ", rule.parts, " blocks") : std::string(),
                 ": choose a --tensor-model-parallel-size that divides it");
      const int64_t block = global[size_t(rule.dim)] / rule.parts, piece = block / T;
      Shape local = global;
      local[size_t(rule.dim)] = piece * rule.parts;
      t = Tensor::empty(local, source_dtype(f, prefix, src->second));
      for (int p = 0; p < rule.parts; ++p) {
        Shape offsets(global.size(), 0);
        offsets[size_t(rule.dim)] = p * block + tp_rank * piece;
        read_source_region(f, prefix, src->second, offsets, t.narrow(rule.dim, p * piece, piece));
      }
    }
    check_finite_tensor(t, prefix + src->second.key, f.metadata_label());
    sink(name, t);
  }
}

}  // namespace megatron::training
