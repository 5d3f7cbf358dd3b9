// The optimizer state of Megatron-LM's torch_dist checkpoints, read in model space.
//
// Megatron-Core saves the per-parameter state of an optimizer as ShardedTensors with the
// parameter's own key, global shape, chunk offsets and replica ids, so it reshards with the
// weights (torch_dist_checkpoint.h says how those are laid out):
//   optimizer.state.exp_avg.<model key>, optimizer.state.exp_avg_sq.<model key>   Adam's moments
//   optimizer.state.momentum_buffer.<model key>                                    SGD's momentum
//   optimizer.state.fp32_param.<model key>   the plain optimizer's fp32 main weights (fp16/bf16
//                                            models; optimizer.py Float16OptimizerWithFloat16Params)
//   optimizer.state.param.<model key>        the distributed optimizer's fp32 main weights in its
//                                            fully_reshardable format (--dist-ckpt-optim-fully-
//                                            reshardable; distrib_optimizer.py sharded_param_state_
//                                            fully_reshardable), fp32 models included
// and the rest in the common state (common.pt "optimizer"): the parameter groups with the step
// count ({"optimizer": {"param_groups": [{..., "step": N}, ...]}, "param_state_sharding_type":
// "fully_reshardable", ...} for the distributed optimizer).
// The distributed optimizer's default format, dp_reshardable (common.pt says only
// "param_state_sharding_type": "dp_reshardable"), holds flat per-bucket tensors and the step count
// in a ShardedObject; it is rebuilt into model space by torch_dist_buckets.h. Not read, and said by
// name (resume with --no-load-optim, or save with --dist-ckpt-optim-fully-reshardable): the
// deprecated fully_sharded_model_space and dp_zero_gather_scatter formats.
#pragma once

#include <cstdint>
#include <string>

#include "core/pickle.h"
#include "core/safetensors.h"
#include "core/torch_file.h"
#include "optim/megatron_optimizer.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_format.h"

namespace megatron::training {

struct TorchDistOptimizer {
  std::string type;   // "adam" | "sgd"; empty: none that this build reads
  int64_t step = 0;   // successful optimizer steps
  std::string note;   // why there is none, when state was saved but is not read; else empty
  bool main_params = false;  // fp32 main weights saved ("param" or "fp32_param")
  bool dp_reshardable = false;  // in the distributed optimizer's flat buckets (torch_dist_buckets.h)
};

// What the folder's keys and the common state's "optimizer" (`common`: nullptr when absent; its
// tensors read through `common_file`) say about the optimizer state. `iteration` stands in for a
// step count the common state lacks (said in `notes`).
TorchDistOptimizer torch_dist_optimizer(const DistcpFolder& f, const pickle::Value* common,
                                        const TorchFile& common_file, int64_t iteration,
                                        std::vector<std::string>& notes);

// The optimizer state of `optimizer`'s parameters for this rank's tensor-parallel rank, as the
// tensors of our per-parameter optimizer file ("optimizer.step", "optimizer.state.<fp32_param |
// exp_avg | exp_avg_sq | momentum_buffer>.<name>", F32 of each parameter's shape on this rank):
// the global tensors cut by the weights' shard rules, new vocabulary rows zero (their fp32 main
// weights repeat the last row, as the weights do). The last pipeline stage's tied copy of the word
// embedding takes the embedding's state (Megatron writes only the main replica).
SafetensorsContents read_torch_dist_optimizer(const CheckpointOnDisk& ckpt,
                                              optim::MegatronOptimizer& optimizer,
                                              const CheckpointRank& rank);

// The optimizer state of a merged torch_dist checkpoint: m.optimizer (global tensors under our
// names; fp32 main weights only for fp16/bf16 models), m.optimizer_type and m.optimizer_step.
void merge_torch_dist_optimizer(const CheckpointOnDisk& ckpt, MergedCheckpoint& m);

}  // namespace megatron::training
