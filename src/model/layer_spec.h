// Layer specs (Megatron-Core's ModuleSpec / TransformerLayerSubmodules): what each part of a
// transformer layer is, chosen per model from the configuration. The layer's composition is fixed
// (pre-norm -> self-attention -> bias-dropout-add -> pre-MLP norm -> MLP -> bias-dropout-add);
// the spec picks the kind of each part:
//   - norms (NormKind of layer_kinds.h): LayerNorm, RMSNorm — --normalization;
//   - activations (ActivationKind of layer_kinds.h): gelu, gelu_tanh, swiglu (gated),
//     squared_relu — selected by Megatron's flags (--swiglu, --squared-relu, --openai-gelu,
//     --no-bias-gelu-fusion);
//   - attention: causal or bidirectional mask, rotary / ALiBi positions, a sliding window, the
//     optional per-head query/key norm, a relative position bias;
//   - an optional cross-attention with its pre-norm (encoder-decoder models).
// A norm or activation kind is a row of layer_kinds.h: the modules run it through one pair of
// ops (ops::norm_fwd / norm_bwd, ops::activation_fwd / activation_bwd) with the row's id and
// take every per-kind property (bias, saved statistics, gated) from the row; the CLI, the
// recorded-settings checks and their messages take the names and flags from the same rows.
// Adding one is its row, its CPU kernel and its op cases: three files (see layer_kinds.h).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/layer_kinds.h"
#include "model/transformer_config.h"

namespace megatron::model {

// Lookups by name; an unknown name is a megatron::Error listing the valid ones.
const NormKind& norm_kind(const std::string& name);
const ActivationKind& activation_kind(const std::string& name);
std::span<const NormKind> norm_kinds();
std::span<const ActivationKind> activation_kinds();
const PositionEmbeddingKind& position_embedding_kind(const std::string& name);
const AttentionMaskKind& attention_mask_kind(const std::string& name);
std::span<const PositionEmbeddingKind> position_embedding_kinds();
std::span<const AttentionMaskKind> attention_mask_kinds();
// The kind named `name` or, for old checkpoints, by its legacy name; nullptr when none is.
const PositionEmbeddingKind* find_position_embedding_kind(const std::string& name);
const RecomputeGranularityKind& recompute_granularity_kind(const std::string& name);
const RecomputeMethodKind& recompute_method_kind(const std::string& name);
const CpCommTypeKind& cp_comm_type_kind(const std::string& name);
const ModelFamilyKind& model_family_kind(const std::string& name);
std::span<const CpCommTypeKind> cp_comm_type_kinds();
std::span<const ModelFamilyKind> model_family_kinds();
// The flag values of a table, for the CLI's choices (the "" of none left out).
std::vector<std::string> recompute_granularity_names();
std::vector<std::string> recompute_method_names();
std::vector<std::string> cp_comm_type_names();
std::vector<std::string> model_family_names();

struct AttentionSpec {
  bool causal = true;               // else bidirectional (with an optional key padding mask)
  bool rope = false;                // rotary embedding of queries and keys
  bool alibi = false;               // ALiBi score bias
  const NormKind* qk_norm = nullptr;  // per-head norm of queries and keys (--qk-layernorm)
  bool relative_bias = false;  // adds LayerContext::attention_bias to the scores (T5's relative)
};

struct MlpSpec {
  const ActivationKind* activation = nullptr;
};

// What fills the FFN slot: a dense MLP, or a mixture-of-experts layer (model/moe/moe_layer.h)
// whose experts are MLPs of MlpSpec's activation.
enum class FfnKind { dense, moe };

struct TransformerLayerSpec {
  const NormKind* input_layernorm = nullptr;
  AttentionSpec self_attention;
  // Cross-attention (an encoder-decoder's decoder layer, Megatron-Core's pre_cross_attn_layernorm
  // and CrossAttention): with a norm kind here, after self-attention the layer adds
  // cross_attention(pre_cross_attn_layernorm(x)) over LayerContext::context; null: none.
  const NormKind* pre_cross_attn_layernorm = nullptr;
  const NormKind* pre_mlp_layernorm = nullptr;
  MlpSpec mlp;
  FfnKind ffn = FfnKind::dense;
};

// The spec of a GPT decoder layer (Megatron-Core's get_gpt_layer_local_spec) for `cfg`.
TransformerLayerSpec gpt_layer_spec(const TransformerConfig& cfg);
// The spec of GPT decoder layer `layer` (0-based, global): gpt_layer_spec with the FFN slot an
// MoE layer where --num-experts and --moe-layer-freq put one.
TransformerLayerSpec gpt_layer_spec(const TransformerConfig& cfg, int layer);

}  // namespace megatron::model
