// Streaming reads of torch_dist checkpoints (training/torch_dist_format.h): a region of a tensor
// is read from only the chunks that intersect it, each chunk's item mapped from its file at its
// recorded offset and copied straight into the destination, so a load holds its own shard plus
// one chunk at a time (never the global tensor of a sharded key, never a whole .distcp file).
//
// On top of it, this run's tensor-parallel shards of the model are read shard by shard: for a
// parameter cut along `dim` into `parts` blocks (SwiGLU's fc1: [gate; up]), the rows of rank r of
// T in each block, read as regions of the Megatron key (one layer of a stacked key; either half of
// a gated pair saved as "_w"/"_v").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/tensor.h"
#include "training/checkpoint.h"
#include "training/torch_dist_format.h"

namespace megatron::training {

// Fills `dest` with the region of tensor entry `key` that starts at `offsets` and has dest's
// shape; with `leading` indices (a layer; a layer and an expert), the region at those indices of
// the leading axes (dest and offsets without them). Reads only the chunks the region intersects;
// checks every item it reads (archive, dtype, shape). dest must have the entry's dtype.
void read_distcp_region(const DistcpFolder& f, const std::string& key, const Shape& offsets, Tensor dest,
                        const Shape& leading = {});

// Where one of the model's tensors (our name) lies: its Megatron key (for SwiGLU's fc1 saved as
// "<key>_w" / "<key>_v", the base key) and its indices on the key's leading axes (the layer axis
// of a stacked key; none for a key of one tensor).
struct TorchDistSource {
  std::string key;
  Shape index;
};
// The sources of the model's tensors under `prefix` (see read_torch_dist_model); defined with
// the key rules in torch_dist_checkpoint.cpp.
// Those `want` accepts; an expert's name is the sequential or the grouped experts' one, as `want`
// asks (without `want`: as the checkpoint's args say).
std::map<std::string, TorchDistSource> torch_dist_sources(const CheckpointOnDisk& ckpt, const DistcpFolder& f,
                                                          const std::string& prefix = "",
                                                          const std::function<bool(const std::string&)>& want = {});

// The global shape of a source (leading axes removed; a gated pair's halves stacked).
Shape source_shape(const DistcpFolder& f, const std::string& prefix, const TorchDistSource& s);
// The whole (single-rank) tensor of a source.
Tensor read_source(const DistcpFolder& f, const std::string& prefix, const TorchDistSource& s);

// read_torch_dist_shards, streamed: each wanted tensor's shard read as regions of its key and
// handed to `sink` (our name, shard) before the next is read.
void stream_torch_dist_shards(const CheckpointOnDisk& ckpt, const std::map<std::string, Shape>& params,
                              const CheckpointRank& rank, const std::string& prefix, bool zero_fill_rows,
                              const std::function<void(const std::string&, const Tensor&)>& sink);

}  // namespace megatron::training
