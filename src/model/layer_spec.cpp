// Lookups into the kind tables of layer_kinds.h, and the GPT layer spec.
#include "model/layer_spec.h"

#include "core/error.h"

namespace megatron::model {

namespace {

// The names of a table's rows, the "" of a none row left out.
template <class Kind>
std::vector<std::string> name_list(std::span<const Kind> kinds) {
  std::vector<std::string> out;
  for (const Kind& k : kinds)
    if (*k.name != '\0') out.emplace_back(k.name);
  return out;
}

template <class Kind>
std::string names(std::span<const Kind> kinds) {
  std::string s;
  for (const std::string& n : name_list(kinds)) s += (s.empty() ? "" : ", ") + n;
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

const RecomputeGranularityKind& recompute_granularity_kind(const std::string& name) {
  return named(std::span<const RecomputeGranularityKind>(kRecomputeGranularityKinds), name,
               "--recompute-granularity");
}

const RecomputeMethodKind& recompute_method_kind(const std::string& name) {
  return named(std::span<const RecomputeMethodKind>(kRecomputeMethodKinds), name,
               "--recompute-method");
}

std::span<const CpCommTypeKind> cp_comm_type_kinds() { return kCpCommTypeKinds; }
std::span<const ModelFamilyKind> model_family_kinds() { return kModelFamilyKinds; }

const CpCommTypeKind& cp_comm_type_kind(const std::string& name) {
  return named(cp_comm_type_kinds(), name, "--cp-comm-type");
}

const ModelFamilyKind& model_family_kind(const std::string& name) {
  return named(model_family_kinds(), name, "model family");
}

std::vector<std::string> recompute_granularity_names() {
  return name_list(std::span<const RecomputeGranularityKind>(kRecomputeGranularityKinds));
}
std::vector<std::string> recompute_method_names() {
  return name_list(std::span<const RecomputeMethodKind>(kRecomputeMethodKinds));
}
std::vector<std::string> cp_comm_type_names() { return name_list(cp_comm_type_kinds()); }
std::vector<std::string> model_family_names() { return name_list(model_family_kinds()); }

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
