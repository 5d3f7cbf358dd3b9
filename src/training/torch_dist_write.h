// Megatron-LM's torch_dist checkpoints written without Python (`checkpoint convert --save-format
// torch_dist`), in the structure the reader (torch_dist_checkpoint.h, torch_dist_format.h,
// torch_dist_optimizer.h) documents and Megatron-Core's dist_checkpointing writes for a TP x PP
// run of data-parallel size 1:
//
//   DIR/latest_checkpointed_iteration.txt          written last
//   DIR/iter_N/metadata.json     {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
//                                 "common_backend": "torch", "common_backend_version": 1}
//              common.pt         torch.save of {"args" (argparse.Namespace, Megatron's names),
//                                "checkpoint_version": 3.0, "iteration", "opt_param_scheduler",
//                                "optimizer" (the distributed optimizer's common part: parameter
//                                groups with the step, "param_state_sharding_type":
//                                "fully_reshardable"), "num_floating_point_operations_so_far"}
//              __R_0.distcp, __R_1.distcp   global rank R = t + T p's items (two writer threads'
//                                files; items alternate between them): each tensor chunk a
//                                torch.save archive of the contiguous chunk, each object a
//                                torch.save of [object]
//              .metadata         pickle of torch.distributed.checkpoint.metadata.Metadata: every
//                                key's TensorStorageMetadata (TensorProperties, global torch.Size,
//                                chunks) or BytesStorageMetadata, and each item's MetadataIndex ->
//                                _StorageInfo (file, offset, length)
// Keys: the model's (Megatron-Core names of --transformer-impl; layer tensors under one key with
// the global layer index as axis 0, one chunk per layer and TP rank; SwiGLU's fc1 two chunks per
// TP rank; replicated tensors by TP rank 0; the tied output layer not written), the optimizer's
// state in model space with the same chunks (optimizer.state.{param, exp_avg, exp_avg_sq |
// momentum_buffer}.<key>: the distributed optimizer's fully_reshardable format; "param" are the
// fp32 main weights, the weights themselves in an fp32 model), and the ShardedObjects as bytes
// items: each layer module's _extra_state ("<key>/shard_<layer>_<L>", None), the output layer's
// ("output_layer._extra_state/shard_0_1") and each rank's RNG state
// ("rng_state/shard_<p>.<t>_<P>.<T>", Megatron's rng_state list for the seed).
// The folder is written under a temporary name, files 0640, folders 0750, fsynced, renamed, and
// the tracker replaced last.
#pragma once

#include <filesystem>

#include "training/checkpoint_convert.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_items.h"

namespace megatron::training {

// Writes merged tensors (padded for the target's vocabulary, m.metadata in our metadata.json
// shape) as a torch_dist checkpoint for TP = tp x PP = pp into save_dir. Returns the iteration
// folder. The keys do not depend on the layout; common.pt's args record it as a Megatron-LM run
// of that layout would: options.expert_model_parallel_size EP (a divisor of the experts per MoE
// layer; the data-parallel size then EP, the smallest such a run has, the experts split over TP)
// and, with layers_per_virtual_stage > 0, its virtual pipeline stages.
std::filesystem::path write_torch_dist_checkpoint(const MergedCheckpoint& m, const std::filesystem::path& save_dir,
                                                  int tp, int pp, const TorchSaveOptions& options = {},
                                                  int layers_per_virtual_stage = 0);

// pretrain-gpt --ckpt-format torch_dist (torch_dist_save.cpp): save_checkpoint's inputs and
// collective contract, Megatron's torch_dist folder out, each rank writing its own items into
// __<world rank>_0/1.distcp as Megatron-Core's fully parallel save: the weights (by DP rank 0 of
// each model-parallel rank, TP chunks and layer axis as above, names of --transformer-impl; an
// MoE layer's experts by expert data-parallel rank 0 of each expert-parallel rank, torch_dist_moe.h), the
// optimizer state, and the ShardedObjects (RNG states, _extra_state); world rank 0 gathers every
// item's place and writes .metadata, common.pt and metadata.json, then renames the temporary
// folder and replaces the tracker. The optimizer state: the plain optimizer's per parameter in
// model space (optimizer.state.{fp32_param (half models), exp_avg, exp_avg_sq | momentum_buffer}
// .<key>, the step in common.pt's param groups), or the distributed optimizer's in Megatron's
// default dp_reshardable form, each DP rank writing the pieces it holds at their places in the
// flat buckets (torch_dist_buckets.h, BERT's and T5's order in torch_dist_buckets_family.h; in the
// order of --transformer-impl's modules), DP rank 0 the
// gaps (zeros) and
// the ShardedObjects "optimizer" (param groups with the step), "per_bucket_numel" and
// "per_bucket_numel_unpadded". Returns the iteration folder.
std::filesystem::path save_torch_dist_checkpoint(const std::filesystem::path& save_dir, const CheckpointState& state,
                                                 const model::ParameterList& params,
                                                 optim::MegatronOptimizer* optimizer, const CheckpointRank& rank = {},
                                                 const TorchSaveOptions& options = {});
// What --ckpt-format torch_dist saves: GPT models (dense or MoE; experts under any
// --expert-tensor-parallel-size), BERT and T5 models, virtual stages with the plain optimizer's
// state (keys by global layer numbers), the distributed optimizer's state for models of one model
// chunk (with experts: --expert-tensor-parallel-size equal to TP, no legacy grouped experts); an
// Error names the flag otherwise.
void check_torch_dist_save(const TrainingArgs& a, int vp_size, int ep_size);

// The ShardedObjects of global rank (t, p, d) (`meta` in our metadata.json shape): with t = d = 0
// each layer module's _extra_state and the output layer's (an MoE layer's experts': by expert
// tensor-parallel rank et = 0 (-1: et is t) and expert data-parallel rank edp = 0, for the
// experts of expert-parallel rank ep of EP;
// torch_dist_moe.h), and each rank's RNG state ("rng_state/shard_<p>.<t>_<P>.<T>", with DP > 1
// "rng_state/shard_<p>.<t>.<d>_<P>.<T>.<DP>").
void add_object_items(std::vector<torch_dist_io::WriteItem>& items, const std::filesystem::path& tmp,
                      const TrainingArgs& a, const nlohmann::json& meta, int t, int T, int p, int P, int d, int DP,
                      bool transformer_engine, int edp = 0, int ep = 0, int EP = 1, int et = -1);

}  // namespace megatron::training
