// Lookups into the kind tables of layer_kinds.h, and the GPT layer spec.
#include "model/layer_spec.h"

#include "core/error.h"

namespace megatron::model {

namespace {

template <class Kind>
std::string names(std::span<const Kind> kinds) {
  std::string s;
  for (const Kind& k : kinds) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

// The row named `name`; an unknown name is an Error listing the valid ones after `what`.
template <class Kind>
const Kind& named(std::span<const Kind> kinds, const std::string& name, const char* what) {
  for (const Kind& k : kinds)
    if (name == k.name) return k;
  MG_THROW(what, " '", name, "' is not one of: ", names(kinds));
}

}  // namespace

std::span<const NormKind> norm_kinds() { return kNormKinds; }
std::span<const ActivationKind> activation_kinds() { return kActivationKinds; }

const NormKind& norm_kind(const std::string& name) {
  return named(norm_kinds(), name, "--normalization");
}

const ActivationKind& activation_kind(const std::string& name) {
  return named(activation_kinds(), name, "activation");
}

std::span<const PositionEmbeddingKind> position_embedding_kinds() { return kPositionEmbeddingKinds; }
std::span<const AttentionMaskKind> attention_mask_kinds() { return kAttentionMaskKinds; }

const PositionEmbeddingKind* find_position_embedding_kind(const std::string& name) {
  for (const PositionEmbeddingKind& k : position_embedding_kinds())
    if (name == k.name || (*k.legacy != '\0' && name == k.legacy)) return &k;
  return nullptr;
}

const PositionEmbeddingKind& position_embedding_kind(const std::string& name) {
  return named(position_embedding_kinds(), name, "--position-embedding-type");
}

const AttentionMaskKind& attention_mask_kind(const std::string& name) {
  return named(attention_mask_kinds(), name, "attention mask type");
}

TransformerLayerSpec gpt_layer_spec(const TransformerConfig& cfg) {
  TransformerLayerSpec s;
  s.input_layernorm = &norm_kind(cfg.normalization);
  s.pre_mlp_layernorm = s.input_layernorm;
  s.self_attention.causal = cfg.causal();
  s.self_attention.rope = cfg.rope();
  s.self_attention.alibi = cfg.alibi();
  if (cfg.qk_layernorm) s.self_attention.qk_norm = s.input_layernorm;
  s.mlp.activation = &activation_kind(cfg.activation);
  return s;
}

TransformerLayerSpec gpt_layer_spec(const TransformerConfig& cfg, int layer) {
  TransformerLayerSpec s = gpt_layer_spec(cfg);
  if (cfg.is_moe_layer(layer)) s.ffn = FfnKind::moe;
  return s;
}

}  // namespace megatron::model
