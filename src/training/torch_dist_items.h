// The pieces every torch_dist writer shares (`checkpoint convert --save-format torch_dist`,
// torch_dist_write.h, and pretrain-gpt --ckpt-format torch_dist, torch_dist_save.h): a rank's
// items written into its two __R_0/__R_1.distcp files, PyTorch's .metadata of every rank's items,
// and Megatron's common.pt and metadata.json. The layouts are documented in torch_dist_write.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/pickle.h"
#include "core/tensor.h"
#include "training/checkpoint_convert.h"

namespace megatron::training::torch_dist_io {

// One item of a rank's files: a tensor chunk (key, global shape, offsets, contiguous data) or an
// object (key, its torch.save bytes).
struct WriteItem {
  std::string key;
  Shape global, offsets;
  Tensor data;
  std::vector<uint8_t> bytes;
  bool is_bytes = false;
};

// Where an item went, for .metadata (gathered from every rank as JSON).
struct ItemRecord {
  std::string key;
  bool is_bytes = false;
  DType dtype = DType::F32;
  Shape global, offsets, sizes;
  std::string file;
  uint64_t offset = 0, length = 0;
};
nlohmann::json records_to_json(const std::vector<ItemRecord>& r);
std::vector<ItemRecord> records_from_json(const nlohmann::json& j);

// The chunks of tensor-parallel rank t (of T) of a tensor: (offset along the rule's dimension,
// data), from the global tensor (`full`) or from rank t's shard (`local`); a replicated tensor is
// TP rank 0's. Each of the rule's parts (SwiGLU's gate and up) is its own chunk, as Megatron's
// apply_swiglu_sharded_factory saves them.
std::vector<std::pair<int64_t, Tensor>> tp_chunks(const Tensor& full, const ShardRule& r, int t, int T,
                                                  const std::string& name);
std::vector<std::pair<int64_t, Tensor>> local_chunks(const Tensor& local, const ShardRule& r, int t, int T);

// Appends the items of those chunks under `key` (a layer tensor, layer >= 0: the layer axis of L
// prepended, the layer its offset). `global` is the tensor's shape without the layer axis.
void add_chunks(std::vector<WriteItem>& items, const std::string& key, int layer, int L, const Shape& global,
                int dim, std::vector<std::pair<int64_t, Tensor>> chunks);

// An object item: torch.save of what `make` builds (through a scratch file in `tmp`).
WriteItem object_item(const std::string& key, const std::function<pickle::Value*(pickle::Document&)>& make,
                      const std::filesystem::path& tmp);

// Writes global rank `rank`'s items into tmp/__<rank>_0.distcp and __<rank>_1.distcp (Megatron's
// two writer threads per rank: the items alternate between them), files 0640; returns where each
// item went. The items' bytes are released as they are written.
std::vector<ItemRecord> write_rank_files(const std::filesystem::path& tmp, int rank, std::vector<WriteItem>& items);

// tmp/.metadata: torch.distributed.checkpoint's Metadata of every item (chunks numbered in the
// order of `records`).
void write_dcp_metadata(const std::filesystem::path& tmp, const std::vector<ItemRecord>& records,
                        const std::string& checkpoint_id);

// What common.pt says beyond our metadata.json (whose shape `meta` has: args, iteration, consumed
// samples, opt_param_scheduler).
struct CommonState {
  nlohmann::json meta;
  int tp = 1, pp = 1, dp = 1;
  // Model chunks per pipeline rank (virtual stages), the expert-parallel size and the expert
  // tensor-parallel size (0: tp), as Megatron's args record them after its validate_args.
  int vp = 1, ep = 1, etp = 0;
  DType dtype = DType::F32;
  int64_t padded_vocab_size = 0;
  std::string transformer_impl = "transformer_engine";
  // Optimizer: "" none; "fully_reshardable" or "dp_reshardable" (the distributed optimizer's, its
  // param groups in common.pt or in the "optimizer" ShardedObject), "plain" (the plain optimizer's
  // per-parameter state, its param groups in common.pt).
  std::string optimizer_form;
  // dp_reshardable under expert parallelism: the experts' optimizer chained to the dense one,
  // Megatron's ChainedOptimizer common state {0: {...}, 1: {...}}.
  bool chained = false;
  std::string optimizer_type = "adam";
  int64_t optimizer_step = 0;
};
// DistributedOptimizer.state_dict() / the inner optimizer's: {"param_groups": [2 groups with the
// step]} (Megatron's groups: with and without weight decay).
// expert_parallel: the groups of the experts' optimizer under expert parallelism (Megatron-Core
// splits the parameter groups by is_expert_parallel and gives those to their own optimizer).
pickle::Value* param_groups_state(pickle::Document& doc, const TrainingArgs& a, bool adam, int64_t step,
                                  bool expert_parallel = false);
// tmp/common.pt and tmp/metadata.json.
void write_common_files(const std::filesystem::path& tmp, const CommonState& c);

}  // namespace megatron::training::torch_dist_io
