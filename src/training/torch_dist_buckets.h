// The distributed optimizer's default torch_dist format, dp_reshardable (Megatron-Core's
// distrib_optimizer.py sharded_param_state_dp_reshardable), read back into model space.
//
// Megatron saves the state of its distributed optimizer as it holds it: per model-parallel rank
// g = t + T p (its data_parallel_group_idx), per gradient buffer i (one per parameter dtype), per
// bucket b, one flat F32 tensor per state
//   optimizer.distributed.dp_group_idx_<g>.gbuf_idx_<i>.dtype_(<param dtype>, <grad dtype>).
//       bucket_idx_<b>.<param | exp_avg | exp_avg_sq>        [the bucket's unpadded elements]
// each data-parallel rank writing the chunks of its contiguous 1/DP of the bucket, and, by DP
// rank 0, ShardedObjects of that prefix: "optimizer" (the param groups with the step count),
// "per_bucket_numel" and "per_bucket_numel_unpadded". The flat layout is the gradient buffer's
// (param_and_grad_buffer.py): the rank's parameters in the reverse order of registration
// (named_parameters: the embedding, per layer input_layernorm, self_attention.linear_proj,
// self_attention.linear_qkv, q/k layernorms, pre_mlp_layernorm, mlp.linear_fc1, mlp.linear_fc2,
// then the final norm and the output layer; weight before bias), each starting at a multiple of
// 64 elements, the gaps garbage; one bucket without --overlap-grad-reduce (with it, buckets of
// --ddp-bucket-size elements, default max(4e7, 1e6 DP), on the first pipeline stage only), and
// the tied word embedding of a pipelined run (the first stage's embedding, the last stage's
// output_layer.weight copy) in a bucket of its own. Each parameter's slice is the saving rank's
// tensor-parallel shard of its state; the shards merge by the weights' shard rules.
//
// With virtual pipeline stages one distributed optimizer spans the rank's model chunks: chunk v's
// buffer is gbuf_idx_<v> (distrib_optimizer.py chains per_model_buffers in chunk order), bucketed
// only for chunk 0 of the first stage (distributed_data_parallel.py), and the ShardedObjects list
// one entry per chunk.
// The layout is rebuilt from the checkpoint's args and checked against the saved bucket sizes;
// checkpoints whose layout this build cannot rebuild are refused naming what differs: experts with
// virtual pipeline stages, with --expert-tensor-parallel-size other than TP or Megatron's legacy
// GroupedMLP, several gradient buffers per chunk (mixed parameter dtypes), a bucket count or size
// other than the rebuilt one.
// Megatron itself reads this format only under the saving TP x PP (any DP); here the merged
// state loads under any layout. Mixture-of-experts models: torch_dist_buckets_moe.h (the experts'
// own buffer and chained optimizer under expert parallelism).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "training/checkpoint.h"
#include "training/torch_dist_format.h"

namespace megatron::training {

// One parameter's place in a bucket of Megatron's gradient buffer.
struct BufferSlot {
  std::string name;  // our name (the last stage's tied copy: output_layer.weight)
  Shape local;       // the rank's shard
  int64_t start = 0; // first element in its bucket
  bool tied_copy = false;
};
struct BufferBucket {
  int64_t unpadded = 0, padded = 0;  // elements saved; with the padding to lcm(DP, 128)
  std::vector<BufferSlot> params;
};

// Pipeline rank p's gradient buffer as Megatron-Core lays it out for the model whose parameters
// `local` gives (our name -> this rank's shard shape; nullopt: none by that name), with L layers
// over P stages, DP data-parallel ranks, a tied embedding or not and a bucket size (0: none). The
// names it places go into `placed`. With transformer_engine, the registration order of Transformer
// Engine's modules (the layer norms fused into linear_qkv and linear_fc1). With `experts` > 0 the
// layers' MoE parameters too (torch_dist_buckets_moe.h; `local` picks the buffer's). With V > 1
// virtual stages, the buffer of model chunk v (gbuf_idx_<v>): layers [(v P + p) L/(P V), + L/(P V)),
// the embedding in chunk 0 of stage 0, the final norm and output layer in chunk V - 1 of the last.
std::vector<BufferBucket> megatron_buffer_layout(const std::function<std::optional<Shape>(const std::string&)>& local,
                                                 int p, int P, int64_t L, int64_t DP, bool tied, int64_t bucket_size,
                                                 std::set<std::string>* placed = nullptr, bool transformer_engine = false,
                                                 int64_t experts = 0, int v = 0, int V = 1);

// The buckets of a rank whose parameters are `order` (named_parameters() order; the tied copy
// marked), laid out as megatron_buffer_layout does.
std::vector<BufferBucket> buckets_in_order(const std::vector<BufferSlot>& order, int p, int P, int64_t DP, bool tied,
                                           int64_t bucket_size);

// True when the folder holds dp_reshardable buckets.
bool has_dp_reshardable_state(const DistcpFolder& f);

// The state in model space: Megatron's kind ("param", "exp_avg", "exp_avg_sq") -> our name ->
// the global (single-rank) F32 tensor, every value checked finite; the tied copy is dropped.
std::map<std::string, std::map<std::string, Tensor>> read_dp_reshardable_state(const CheckpointOnDisk& ckpt,
                                                                              const DistcpFolder& f);

}  // namespace megatron::training
