// PyTorch's distributed-checkpoint folder (torch.distributed.checkpoint, "DCP"), as Megatron-Core's
// torch_dist backend writes it, read without Python:
//
//   ITER/.metadata          pickle of torch.distributed.checkpoint.metadata.Metadata:
//                           state_dict_metadata  {key: TensorStorageMetadata(properties (dtype, ...),
//                                                  size (global shape), chunks [ChunkStorageMetadata
//                                                  (offsets, sizes)]) | BytesStorageMetadata()}
//                           storage_data         {MetadataIndex(fqn, offset (a chunk's offsets; None
//                                                  for bytes), index): _StorageInfo(relative_path,
//                                                  offset, length)}
//   ITER/__R_N.distcp       rank R's items back to back (N: its writer thread): a tensor item is a
//                           torch.save of the chunk (a zip archive, core/torch_file.h), a bytes item
//                           its raw bytes (Megatron: a torch.save of [object, ...]).
//
// The .metadata is read by the restricted unpickler's distcp mode (core/pickle.h
// unpickle_distcp_metadata: the classes are plain data, nothing is executed). Opening checks every
// entry against the files before any tensor is read: relative paths are plain names of existing
// files in the folder, every item lies inside its file, global shapes are non-negative and their
// bytes bounded by the folder's .distcp bytes, every chunk lies inside its tensor, chunks do not
// overlap and cover the tensor exactly, and each chunk has its item. Reading a tensor checks the
// item's archive (CRC-32), its dtype and shape against the chunk's. Every error names the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace megatron::training {

struct DistcpItem {
  std::string file;  // relative path (a plain file name)
  uint64_t offset = 0, length = 0;
};

struct DistcpChunk {
  Shape offsets, sizes;
  DistcpItem item;
};

struct DistcpEntry {
  bool is_bytes = false;
  DType dtype = DType::F32;  // tensors
  Shape size;                // tensors: the global shape
  std::vector<DistcpChunk> chunks;
  DistcpItem item;  // bytes
};

class DistcpFolder {
 public:
  // Reads and checks ITER/.metadata (see above); an Error names what is wrong and where.
  static DistcpFolder open(const std::filesystem::path& dir);

  const std::map<std::string, DistcpEntry>& entries() const { return entries_; }
  bool has(const std::string& key) const { return entries_.count(key) > 0; }
  const DistcpEntry& entry(const std::string& key) const;
  // The global tensor of a tensor entry, assembled from its chunks.
  Tensor tensor(const std::string& key) const;
  // The raw bytes of a bytes entry.
  std::vector<uint8_t> bytes(const std::string& key) const;
  const std::filesystem::path& dir() const { return dir_; }
  std::string metadata_label() const { return (dir_ / ".metadata").string(); }

 private:
  std::vector<uint8_t> read_item(const DistcpItem& item, const std::string& key) const;

  std::filesystem::path dir_;
  std::map<std::string, DistcpEntry> entries_;
  std::map<std::string, uint64_t> file_sizes_;
};

}  // namespace megatron::training
