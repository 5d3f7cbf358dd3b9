// A trainable parameter as the optimizer, the gradient reduction and checkpoints see it: a weight
// spec (everything a consumer needs to know about the weight without guessing from its name) plus
// its tensors. `value` is the model's copy in the parameter dtype (fp32, or bf16/fp16 under
// --bf16/--fp16); `grad` is the fp32 main gradient that backward accumulates into (+=). The
// optimizer keeps the fp32 main weights separately.
//
// Every weight is created from its spec (module.h Weight::init), and checkpoints record the specs
// (training/checkpoint.h "weights"), so initialisation, resharding, Megatron .pt and Hugging Face
// conversion read how a weight is initialised and sharded instead of inferring it from the name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace megatron::model {

// How a weight's initial value is drawn (Megatron-Core's init_method / output_layer_init_method
// and the norms' and biases' constants). Normal draws take the whole single-rank tensor from the
// weight's own Philox stream (init_parameter, weight_init.h).
enum class InitMethod : uint8_t {
  zeros,          // biases; a zero-centred norm weight (--apply-layernorm-1p stores gamma - 1)
  ones,           // norm weights
  normal,         // N(0, --init-method-std): embeddings, input projections, heads
  scaled_normal,  // N(0, --init-method-std / sqrt(2 * num_layers)): output projections
};
// Its name in checkpoint metadata ("zeros", "ones", "normal", "scaled_normal") and back (nullopt
// for an unknown name).
const char* init_method_name(InitMethod m);
std::optional<InitMethod> parse_init_method(std::string_view name);

// The group a weight's gradient is reduced over across model replicas. Every weight today is
// reduced over the data-parallel (x context-parallel) group.
enum class GradReduction : uint8_t { data_parallel };
const char* grad_reduction_name(GradReduction r);
std::optional<GradReduction> parse_grad_reduction(std::string_view name);

struct WeightSpec {
  std::string name;  // the Megatron-Core key, e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  InitMethod init = InitMethod::normal;
  bool weight_decay = true;  // false for biases and norm weights (Megatron's rule: 1-D params)
  // Tensor-parallel layout (the rules are in model/tensor_parallel.h):
  int partition_dim = -1;  // dimension split across TP ranks, -1 if replicated
  // The full tensor is `partition_parts` equal blocks along partition_dim, each split across the
  // ranks; a shard is the rank's piece of every block, in order (SwiGLU's fc1 [gate; up]: 2).
  int partition_parts = 1;
  // Dimension 0 spans the padded vocabulary (the word table, the output layer's weight and bias):
  // converters re-pad it when the padding changes with the tensor-parallel size.
  bool padded_vocab = false;
  // Replicated, but its gradient is a partial sum over the tensor-parallel group, which the
  // trainer all-reduces: it sees only a sequence shard (sequence parallelism), or only this rank's
  // heads (the per-head query/key norm of --qk-layernorm).
  bool sequence_parallel = false;
  // A replica of a parameter owned by another pipeline stage (Megatron's `shared`): the last
  // stage's copy of the tied word embedding, "output_layer.weight" (model/stage_model.h). Its
  // gradient is summed with the owner's over the embedding group; it is left out of the grad
  // norm (counted once, on the owner) and checkpoints need not store it.
  bool shared = false;
  GradReduction grad_reduction = GradReduction::data_parallel;
  // The expert axis: the (global) number of the mixture-of-experts expert this weight belongs to
  // (decoder.layers.<l>.mlp.experts.local_experts.<expert>.*), -1 for every other weight.
  int expert = -1;
};

struct Parameter : WeightSpec {
  Tensor value;  // param dtype, model layout (this rank's shard)
  Tensor grad;   // fp32, same shape; accumulated by backward
};

using ParameterList = std::vector<Parameter*>;

}  // namespace megatron::model
