// A trainable parameter as the optimizer, the gradient reduction and checkpoints see it.
// `value` is the model's copy in the parameter dtype (fp32, or bf16/fp16 under --bf16/--fp16);
// `grad` is the fp32 main gradient that backward accumulates into (+=). The optimizer keeps the
// fp32 main weights separately. `name` is the Megatron-Core key (e.g.
// "decoder.layers.0.self_attention.linear_qkv.weight"), used by checkpoints and converters.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace megatron::model {

struct Parameter {
  std::string name;
  Tensor value;  // param dtype, model layout
  Tensor grad;   // fp32, same shape; accumulated by backward
  bool weight_decay = true;  // false for biases and norm weights (Megatron's rule: 1-D params)
  // Tensor-parallel layout, for checkpoints, resharding and the grad norm (the rules are in
  // model/tensor_parallel.h):
  int partition_dim = -1;         // dimension split across TP ranks, -1 if replicated
  // The full tensor is `partition_parts` equal blocks along partition_dim, each split across the
  // ranks; a shard is the rank's piece of every block, in order (SwiGLU's fc1 [gate; up]: 2).
  int partition_parts = 1;
  // Replicated, but its gradient is a partial sum over the tensor-parallel group, which the
  // trainer all-reduces: it sees only a sequence shard (sequence parallelism), or only this rank's
  // heads (the per-head query/key norm of --qk-layernorm).
  bool sequence_parallel = false;
  // A replica of a parameter owned by another pipeline stage (Megatron's `shared`): the last
  // stage's copy of the tied word embedding, "output_layer.weight" (model/gpt_stage.h). Its
  // gradient is summed with the owner's over the embedding group; it is left out of the grad
  // norm (counted once, on the owner) and checkpoints need not store it.
  bool shared = false;
};

using ParameterList = std::vector<Parameter*>;

}  // namespace megatron::model
