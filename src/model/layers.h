// Transformer layers with explicit forward and backward (Megatron-Core "local" spec, pre-LN GPT).
// Activations are batch-first [b*s, width] fp32 row-major matrices. Each layer owns its
// Parameters (value in params_dtype, fp32 grad accumulated +=) and an fp32 working copy of its
// weights (an alias when params_dtype is fp32, refreshed by refresh_working_weights() otherwise).
// What a layer keeps for backward is its `Saved` struct (shapes in comments); forward with
// ctx.save == false drops it at the end so full recomputation can rerun the forward later.
// Tensor parallelism: the linears are ColumnParallelLinear / RowParallelLinear and the embedding is
// vocab-parallel (parallel_layers.h); attention runs this rank's n/T heads (g/T query groups) and
// the MLP its ffn/T columns. Under sequence parallelism LayerNorm, dropout and the residual adds
// see this rank's block of rows only (their inputs and outputs are [N/T, h]); dropout masks are
// indexed by the element's position in the unsharded tensor, so masks do not depend on TP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "model/layer_base.h"
#include "model/parallel_layers.h"
#include "model/parameter.h"

namespace megatron::model {

class LayerNorm {
 public:
  // sequence_parallel: the input is a sequence shard, so the weight and bias gradients are
  // partial sums (Parameter::sequence_parallel).
  LayerNorm(const std::string& prefix, int64_t h, float eps, DType dtype,
            bool sequence_parallel = false);
  struct Saved {
    Tensor x;     // [N, h] (shared with the caller's input)
    Tensor mean;  // [N]
    Tensor rstd;  // [N]
    size_t bytes() const { return bytes_of(mean) + bytes_of(rstd); }  // x belongs to the caller
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);                // -> [N, h]
  Tensor backward(const LayerContext& ctx, const Tensor& dout);           // -> dx [N, h]
  // dx_accum += d(input) (the residual stream's gradient).
  void backward_accumulate(const LayerContext& ctx, const Tensor& dout, const Tensor& dx_accum);
  void parameters(ParameterList& out);
  void refresh_working_weights();
  Saved saved;
  Weight weight, bias;
  float eps;
};

// Full (single-rank) sizes; a tensor-parallel layer holds heads/T heads and groups/T groups.
struct AttentionDims {
  int heads = 0, groups = 0, head_dim = 0;
  float attention_dropout = 0;
};

class SelfAttention {
 public:
  // cp: context parallelism (context_parallel.h): queries are this rank's tokens, keys and
  // values the whole sequence, passed round a ring (p2p) or gathered over the group.
  SelfAttention(const std::string& prefix, int64_t h, const AttentionDims& dims, int layer,
                DType dtype, const TensorParallel& tp = TensorParallel::none(),
                const ContextParallel& cp = ContextParallel::none());
  struct Saved {
    // n, g: this rank's heads and query groups (n/T, g/T of the layer's).
    Tensor qkv;    // [N, g*(n/g+2)*d] output of linear_qkv (with bias)
    Tensor lse;    // [b, n, s] softmax log-sum-exp
    // [b, n, s, s] softmax probabilities ([b, n, s, C*s] under context parallelism with the
    // all-gather); empty under selective recompute and with the CP ring (recomputed by blocks)
    Tensor probs;
    Tensor ctx;    // [N, n*d] input of linear_proj
    size_t bytes() const { return bytes_of(qkv) + bytes_of(lse) + bytes_of(probs) + bytes_of(ctx); }
  };
  // x and the result are [N, h], or [N/T, h] under sequence parallelism.
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> without proj bias
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx
  void parameters(ParameterList& out);
  void refresh_working_weights();
  Saved saved;
  ColumnParallelLinear linear_qkv;
  RowParallelLinear linear_proj;
  AttentionDims dims;  // this rank's heads and groups
  int head_offset = 0, total_heads = 0;  // first global head held here; the layer's heads
  int layer;
  ContextParallel cp;
};

class MLP {
 public:
  MLP(const std::string& prefix, int64_t h, int64_t ffn, bool gelu_tanh, DType dtype,
      const TensorParallel& tp = TensorParallel::none());
  struct Saved {
    Tensor h1;  // [N, F/T] fc1 output (pre-activation)
    Tensor a1;  // [N, F/T] activation output, input of fc2
    size_t bytes() const { return bytes_of(h1) + bytes_of(a1); }
  };
  // x and the result are [N, h], or [N/T, h] under sequence parallelism.
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> without fc2 bias
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx
  void parameters(ParameterList& out);
  void refresh_working_weights();
  Saved saved;
  ColumnParallelLinear linear_fc1;
  RowParallelLinear linear_fc2;
  bool gelu_tanh;
};

// Pre-LN block: x2 = x + drop(attn(ln1(x)) + b_proj); y = x2 + drop(mlp(ln2(x2)) + b_fc2).
class TransformerLayer {
 public:
  TransformerLayer(int index, int64_t h, int64_t ffn, const AttentionDims& dims, float eps,
                   float hidden_dropout, bool gelu_tanh, DType dtype,
                   const TensorParallel& tp = TensorParallel::none(),
                   const ContextParallel& cp = ContextParallel::none());
  // Rows R = N, or N/T (this rank's sequence shard) under sequence parallelism.
  struct Saved {
    Tensor x;   // [R, h] layer input (shared with the caller)
    Tensor x2;  // [R, h] residual stream after attention
    size_t bytes() const { return bytes_of(x2); }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // -> [R, h]
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx [R, h]
  void drop_saved();         // frees everything kept for backward (full recompute)
  size_t saved_bytes() const;
  // Everything this layer and its sublayers keep between a forward and its backward. A pipeline
  // stage holds several micro-batches in flight: it moves the state out after each forward
  // (take_saved leaves the layer empty) and back in before that micro-batch's backward.
  struct SavedState {
    Saved layer;
    LayerNorm::Saved input_layernorm, pre_mlp_layernorm;
    SelfAttention::Saved self_attention;
    LinearBase::Saved linear_qkv, linear_proj;
    MLP::Saved mlp;
    LinearBase::Saved linear_fc1, linear_fc2;
  };
  SavedState take_saved();
  void restore_saved(SavedState&& s);
  void parameters(ParameterList& out);
  void refresh_working_weights();
  int index;
  float hidden_dropout;
  TensorParallel tp;
  Saved saved;
  LayerNorm input_layernorm;
  SelfAttention self_attention;
  LayerNorm pre_mlp_layernorm;
  MLP mlp;
};

}  // namespace megatron::model
