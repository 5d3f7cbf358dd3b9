// Megatron-LM's distributed optimizer in its own checkpoints (--ckpt-format torch):
//
//   iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt  "optimizer": DistributedOptimizer.state_dict(),
//       {"optimizer": {"param_groups": [...]}} (no "state", no "params": the step in each group),
//       "grad_scaler" with fp16
//   iter_N/mp_rank_TT[_PPP]/distrib_optim.pt    save_parameter_state: what
//       get_parameter_state_dp_zero gathers to data-parallel rank 0 of that TP x PP rank,
//       {"buckets_coalesced": True, 0: {(param_dtype, grad_dtype): {"param", "exp_avg",
//       "exp_avg_sq": F32 [numel_unpadded], "numel_unpadded": int}}}
//   (under Megatron-Core's ChainedOptimizer: the list of such dicts, one per optimizer, None for
//   one whose data-parallel rank 0 is another rank).
//
// The flat tensors are the gradient buffer's (param_and_grad_buffer.py, rebuilt by
// megatron_buffer_layout in torch_dist_buckets.h): the rank's parameters in reverse registration
// order, each at a multiple of 64 elements (the gaps zeros), buckets one after the other without
// their end padding. "param" is the fp32 main weight. Older Megatron-Core releases wrote the
// per-bucket form: {"per_bucket_numel", "per_bucket_numel_unpadded", 0: {dtype: {"param":
// [one padded tensor per bucket], ...}}}; both are read, written is the coalesced one (the form
// every release since reads).
//
// Read are files of Megatron-Core's models with the local or Transformer Engine layer spec
// (--transformer-impl), one model chunk, one gradient buffer; another layout (the legacy
// megatron/model modules, virtual stages, experts) is refused naming what differs.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/pickle.h"
#include "core/safetensors.h"
#include "training/torch_checkpoint.h"

namespace megatron::training::torch_distrib {

inline constexpr const char* kDistribOptimFile = "distrib_optim.pt";

// Why the distributed optimizer's state of a checkpoint with these args cannot be read ("" when
// it can): another transformer implementation, virtual pipeline stages, experts.
std::string unreadable(const pickle::Value* ns);

// The state of one TP x PP rank's distrib_optim.pt (next to `model_file`) as our optimizer files
// hold it ("optimizer.state.<exp_avg|exp_avg_sq|fp32_param>.<name>", "optimizer.step"), for the
// rank's parameters `params` (Megatron's order, the tied copy included), pipeline rank p of P;
// `model` is that rank's model_optim_rng.pt (its optimizer entry `layout` holds the step).
SafetensorsContents read_rank(const TorchFile& model, const std::filesystem::path& model_file,
                              const pickle::Value* ns,
                              const torch_detail::TorchOptimizers& layout,
                              const std::vector<torch_detail::TorchParam>& params, int p, int P,
                              int64_t num_layers, DType params_dtype);

// Writing (write_torch_checkpoint with TorchSaveOptions::distributed_optimizer).
struct BufferSpec {
  int p = 0, P = 1;            // pipeline rank and size
  int64_t num_layers = 0;
  int64_t data_parallel_size = 1;
  bool tied = true;            // a tied word embedding
  int64_t bucket_size = 0;     // this stage's (0: one bucket)
  bool transformer_engine = true;
  DType params_dtype = DType::F32;
  bool grad_reduce_in_bf16 = false;
};
// One rank's distrib_optim.pt: `local` our name -> the rank's shard shape (the last stage's tied
// copy under the embedding's name), `shard(name, kind)` the shard's values for a buffer slot name
// (output_layer.weight for the tied copy) and a kind "param" (the fp32 main weight), "exp_avg",
// "exp_avg_sq". The dtype key is the buffer's (param_dtype, grad_dtype) as Megatron's
// DistributedDataParallel makes it: bf16 grads in fp32 unless --grad-reduce-in-bf16 (validate_args),
// fp16 and fp32 grads in the parameter dtype.
void write_rank(const std::filesystem::path& file, const std::map<std::string, Shape>& local,
                const BufferSpec& spec,
                const std::function<Tensor(const std::string& name, const std::string& kind)>& shard);
// DistributedOptimizer.state_dict() for the plain optimizer state dict `plain` the writer built
// (FP32Optimizer's torch state dict, or Float16OptimizerWithFloat16Params' dict): the inner
// optimizer's param_groups without "params", the step in each group, the grad scaler.
pickle::Value* state_dict(pickle::Document& doc, const pickle::Value& plain, int64_t step);

}  // namespace megatron::training::torch_distrib
