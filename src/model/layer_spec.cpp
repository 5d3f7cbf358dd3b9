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

}  // namespace

std::span<const NormKind> norm_kinds() { return kNormKinds; }
std::span<const ActivationKind> activation_kinds() { return kActivationKinds; }

const NormKind& norm_kind(const std::string& name) {
  for (const NormKind& k : norm_kinds())
    if (name == k.name) return k;
  MG_THROW("--normalization '", name, "' is not one of: ", names(norm_kinds()));
}

const ActivationKind& activation_kind(const std::string& name) {
  for (const ActivationKind& k : activation_kinds())
    if (name == k.name) return k;
  MG_THROW("activation '", name, "' is not one of: ", names(activation_kinds()));
}

std::span<const PositionEmbeddingKind> position_embedding_kinds() { return kPositionEmbeddingKinds; }
std::span<const AttentionMaskKind> attention_mask_kinds() { return kAttentionMaskKinds; }

const PositionEmbeddingKind* find_position_embedding_kind(const std::string& name) {
  for (const PositionEmbeddingKind& k : position_embedding_kinds())
    if (name == k.name || (*k.legacy != '\0' && name == k.legacy)) return &k;
  return nullptr;
}

const PositionEmbeddingKind& position_embedding_kind(const std::string& name) {
  for (const PositionEmbeddingKind& k : position_embedding_kinds())
    if (name == k.name) return k;
  MG_THROW("--position-embedding-type '", name, "' is not one of: ", names(position_embedding_kinds()));
}

const AttentionMaskKind& attention_mask_kind(const std::string& name) {
  for (const AttentionMaskKind& k : attention_mask_kinds())
    if (name == k.name) return k;
  MG_THROW("attention mask type '", name, "' is not one of: ", names(attention_mask_kinds()));
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

}  // namespace megatron::model
