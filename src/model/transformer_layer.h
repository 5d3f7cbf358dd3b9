// One decoder layer (Megatron-Core's TransformerLayer), its parts chosen by the layer spec:
//   x2 = x + dropout(self_attention(input_layernorm(x)) + b_proj)
//   x2 = x2 + dropout(cross_attention(pre_cross_attn_layernorm(x2)) + b_proj)   with a
//        cross-attention in the spec (an encoder-decoder's decoder layer)
//   y  = x2 + dropout(mlp(pre_mlp_layernorm(x2)) + b_fc2)
// The FFN slot `mlp` is a closed variant (TransformerLayerSpec::ffn): a dense MLP or an MoE layer
// (model/moe/moe_layer.h; no fc2 bias), both named <block>.layers.<index>.mlp.
// Activations are batch-first [b*s, h] rows; under sequence parallelism the norms, dropouts and
// residual adds see this rank's block of rows only ([N/T, h]); dropout masks are indexed by the
// element's position in the unsharded tensor, so they depend on neither TP nor CP.
#pragma once

#include <string>
#include <variant>

#include <memory>

#include "model/attention.h"
#include "model/cross_attention.h"
#include "model/layer_spec.h"
#include "model/mlp.h"
#include "model/module.h"
#include "model/moe/moe_layer.h"
#include "model/norm.h"

namespace megatron::model {

class TransformerLayer : public Module {
 public:
  // index: the global layer number (parameter names <block>.layers.<index>., dropout streams);
  // block: the name of the transformer block holding it ("decoder", "encoder").
  TransformerLayer(int index, const TransformerConfig& cfg, const TransformerLayerSpec& spec,
                   const TensorParallel& tp = TensorParallel::none(),
                   const ContextParallel& cp = ContextParallel::none(), bool grad = true,
                   const std::string& block = "decoder");
  // The number of parameters a layer of `spec` has (its parameters().size()), without building
  // it: the initialisation streams of a model count the parameters of the layers before a chunk.
  static size_t count_parameters(const TransformerConfig& cfg, const TransformerLayerSpec& spec);
  // Rows R = N, or N/T (this rank's sequence shard) under sequence parallelism.
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // -> [R, h]
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx [R, h]
  int index;
  float hidden_dropout;
  TensorParallel tp;
  Norm input_layernorm;
  SelfAttention self_attention;
  std::unique_ptr<Norm> pre_cross_attn_layernorm;  // with the spec's cross-attention
  std::unique_ptr<CrossAttention> cross_attention;
  Norm pre_mlp_layernorm;
  std::variant<MLP, MoELayer> mlp;
  MoELayer* moe() { return std::get_if<MoELayer>(&mlp); }

 private:
  SavedTensor x_{this, "x", "[R, h] layer input (the caller's)"};
  SavedTensor x2_{this, "x2", "[R, h] residual stream after attention"};
};

}  // namespace megatron::model
