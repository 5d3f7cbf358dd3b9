// Transformer layers with explicit forward and backward (Megatron-Core "local" spec, pre-LN GPT).
// Activations are batch-first [b*s, width] fp32 row-major matrices. Each layer owns its
// Parameters (value in params_dtype, fp32 grad accumulated +=) and an fp32 working copy of its
// weights (an alias when params_dtype is fp32, refreshed by refresh_working_weights() otherwise).
// What a layer keeps for backward is its `Saved` struct (shapes in comments); forward with
// ctx.save == false drops it at the end so full recomputation can rerun the forward later.
// Linear layers are split into ColumnParallelLinear / RowParallelLinear: with a tensor-parallel
// group of size 1 they are plain linears; a tensor-parallel build adds the communication of
// Megatron's mappings (copy/all-reduce, reduce/identity) at the marked places only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/parameter.h"

namespace megatron::model {

// Per-call state every layer sees.
struct LayerContext {
  bool training = false;  // dropout active
  bool save = false;      // keep activations for backward
  bool recompute_core_attention = false;  // selective recompute: no s x s probabilities kept
  uint64_t seed = 0, dropout_offset = 0;
  int64_t batch = 0, seq = 0;
  Tensor attention_start;  // [b, s] int32 or undefined
  // Dropout stream for (micro-batch offset, layer, site): stream = offset << 24 | layer << 4 |
  // site, so every mask is a pure function of (seed, offset, layer, site, element).
  ops::DropoutSpec dropout(float p, int layer, int site) const;
  int64_t rows() const { return batch * seq; }
};

enum DropoutSite : int { kSiteEmbedding = 0, kSiteAttentionProbs = 1, kSiteAttentionOut = 2,
                         kSiteMlpOut = 3 };

size_t bytes_of(const Tensor& t);

// A weight as layers use it: the Parameter plus the fp32 copy used in compute.
struct Weight {
  Parameter param;
  Tensor f32;  // fp32 view/copy of param.value
  void init(const std::string& name, const Shape& shape, DType dtype, bool decay, int pdim);
  void refresh();  // param.value -> f32 (no-op for fp32 params)
};

class LayerNorm {
 public:
  LayerNorm(const std::string& prefix, int64_t h, float eps, DType dtype);
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

// y = x W^T + b, W [out, in] (PyTorch convention). Returns y without the bias when skip_bias_add
// (the caller fuses it, as Megatron's bias-dropout-add does).
class LinearBase {
 public:
  struct Saved {
    Tensor x;  // [N, in] (shared with the caller's input)
    size_t bytes() const { return 0; }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> [N, out]
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx [N, in]; grads +=
  void parameters(ParameterList& out);
  void refresh_working_weights();
  int64_t in_features, out_features;
  bool skip_bias_add;
  Saved saved;
  Weight weight, bias;

 protected:
  LinearBase(const std::string& prefix, int64_t in, int64_t out, bool skip_bias_add, DType dtype,
             int weight_partition_dim, int bias_partition_dim);
};

// Weight split on dim 0 (output rows) across tensor-parallel ranks; input replicated
// (TP: identity forward / all-reduce of dx backward).
class ColumnParallelLinear : public LinearBase {
 public:
  ColumnParallelLinear(const std::string& prefix, int64_t in, int64_t out, DType dtype)
      : LinearBase(prefix, in, out, false, dtype, 0, 0) {}
};
// Weight split on dim 1 (input columns); input already split (TP: all-reduce of y forward,
// identity backward); bias added after the reduction, here by the caller's bias-dropout-add.
class RowParallelLinear : public LinearBase {
 public:
  RowParallelLinear(const std::string& prefix, int64_t in, int64_t out, DType dtype)
      : LinearBase(prefix, in, out, true, dtype, 1, -1) {}
};

struct AttentionDims {
  int heads = 0, groups = 0, head_dim = 0;
  float attention_dropout = 0;
};

class SelfAttention {
 public:
  SelfAttention(const std::string& prefix, int64_t h, const AttentionDims& dims, int layer,
                DType dtype);
  struct Saved {
    Tensor qkv;    // [N, g*(n/g+2)*d] output of linear_qkv (with bias)
    Tensor lse;    // [b, n, s] softmax log-sum-exp
    Tensor probs;  // [b, n, s, s] softmax probabilities; empty under selective recompute
    Tensor ctx;    // [N, n*d] input of linear_proj
    size_t bytes() const { return bytes_of(qkv) + bytes_of(lse) + bytes_of(probs) + bytes_of(ctx); }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> [N, h] without proj bias
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx [N, h]
  void parameters(ParameterList& out);
  void refresh_working_weights();
  Saved saved;
  ColumnParallelLinear linear_qkv;
  RowParallelLinear linear_proj;
  AttentionDims dims;
  int layer;
};

class MLP {
 public:
  MLP(const std::string& prefix, int64_t h, int64_t ffn, bool gelu_tanh, DType dtype);
  struct Saved {
    Tensor h1;  // [N, F] fc1 output (pre-activation)
    Tensor a1;  // [N, F] activation output, input of fc2
    size_t bytes() const { return bytes_of(h1) + bytes_of(a1); }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> [N, h] without fc2 bias
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx [N, h]
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
                   float hidden_dropout, bool gelu_tanh, DType dtype);
  struct Saved {
    Tensor x;   // [N, h] layer input (shared with the caller)
    Tensor x2;  // [N, h] residual stream after attention
    size_t bytes() const { return bytes_of(x2); }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // -> [N, h]
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx [N, h]
  void drop_saved();         // frees everything kept for backward (full recompute)
  size_t saved_bytes() const;
  void parameters(ParameterList& out);
  void refresh_working_weights();
  int index;
  float hidden_dropout;
  Saved saved;
  LayerNorm input_layernorm;
  SelfAttention self_attention;
  LayerNorm pre_mlp_layernorm;
  MLP mlp;
};

// Word + learned absolute position embeddings, then hidden dropout. The word table is also the
// (tied) output layer's weight.
class Embedding {
 public:
  Embedding(int64_t vocab, int64_t max_positions, int64_t h, float dropout, DType dtype);
  struct Saved {
    Tensor tokens;        // [b, s] int32 (caller's)
    Tensor position_ids;  // [b, s] int32 (caller's)
    size_t bytes() const { return 0; }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& tokens, const Tensor& position_ids);
  void backward(const LayerContext& ctx, const Tensor& dout);  // grads +=
  void parameters(ParameterList& out);
  void refresh_working_weights();
  Saved saved;
  Weight word, position;
  float dropout;
};

}  // namespace megatron::model
