// The norm and activation kinds a layer spec can choose (layer_spec.h). The kernels own the kinds
// (kernels/op_kinds.h: the id the ops take, the name, bias, saved statistics, gated); this file
// adds what the model and the CLI say about them: the Megatron flag that selects an activation,
// its help text and its name in messages. The CLI, the recorded-settings checks, the modules
// (model/norm.cpp, model/mlp.cpp) read these rows; nothing else lists the kinds.
//
// Adding a kind: see kernels/op_kinds.h (its op row there, its model row here, its kernels and
// its op cases).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "kernels/op_kinds.h"

namespace megatron::model {

using ops::ActivationId;
using ops::NormId;

// ---- norms over the last dimension: nothing beyond the op row (--normalization takes its name) -
using NormKind = ops::NormOp;
inline constexpr const auto& kNormKinds = ops::kNormOps;

// ---- the MLP's activation: the op row (id, name, gated) and the words around it ---------------
struct ActivationKind : ops::ActivationOp {
  const char* flag;      // a Megatron flag of its own that selects it ("" for the GeLU forms)
  const char* help;
  const char* display;   // in messages: "SwiGLU"
  const char* asked_by;  // the flag that asks for it, for messages ("--openai-gelu" for tanh GeLU)
};

inline constexpr ActivationKind kActivationKinds[] = {
    {ops::kActivationOps[size_t(ActivationId::gelu_tanh)], "",
     "GeLU, tanh form (Megatron's default fused bias-GeLU; --openai-gelu)", "GeLU (tanh form)",
     "--openai-gelu"},
    {ops::kActivationOps[size_t(ActivationId::gelu)], "",
     "GeLU, exact erf form (--no-bias-gelu-fusion, or --disable-bias-linear)",
     "GeLU (exact erf form)", "--no-bias-gelu-fusion"},
    {ops::kActivationOps[size_t(ActivationId::swiglu)], "--swiglu",
     "SwiGLU MLP: silu(gate) * up, fc1 gives [gate | up]", "SwiGLU", "--swiglu"},
    {ops::kActivationOps[size_t(ActivationId::squared_relu)], "--squared-relu",
     "Squared ReLU activation", "squared ReLU", "--squared-relu"},
};

// ---- lookups by id -----------------------------------------------------------------------------
inline constexpr size_t kNormKindCount = ops::kNormOpCount;
inline constexpr size_t kActivationKindCount = std::size(kActivationKinds);
static_assert(kActivationKindCount == ops::kActivationOpCount,
              "kActivationKinds: one row for every activation of kernels/op_kinds.h");
static_assert(ops::rows_in_id_order(kActivationKinds),
              "kActivationKinds: row i must be the kind with id i");

// The row of an id; nullptr for a value outside the enum (a corrupt or uninitialised id).
constexpr const NormKind* find_norm_kind(NormId id) { return ops::find_norm_op(id); }
constexpr const ActivationKind* find_activation_kind(ActivationId id) {
  return size_t(id) < kActivationKindCount ? &kActivationKinds[size_t(id)] : nullptr;
}

}  // namespace megatron::model

namespace megatron::model {

// ---- how positions enter attention (--position-embedding-type) ---------------------------------
enum class PositionEmbeddingId : uint8_t { learned_absolute, rope, alibi, none, relative };

struct PositionEmbeddingKind {
  PositionEmbeddingId id;
  const char* name;    // TransformerConfig::position_embedding_type, Megatron-Core's name
  const char* legacy;  // the legacy model's PositionEmbeddingType member in old checkpoints ("")
};

inline constexpr PositionEmbeddingKind kPositionEmbeddingKinds[] = {
    {PositionEmbeddingId::learned_absolute, "learned_absolute", "absolute"},
    {PositionEmbeddingId::rope, "rope", "rotary"},
    {PositionEmbeddingId::alibi, "alibi", ""},
    {PositionEmbeddingId::none, "none", ""},  // --no-position-embedding
    {PositionEmbeddingId::relative, "relative", ""},  // T5's bucketed relative position bias
};
static_assert(ops::rows_in_id_order(kPositionEmbeddingKinds),
              "kPositionEmbeddingKinds: row i must be the kind with id i");

// ---- the attention mask (fixed by the model family) --------------------------------------------
enum class AttentionMaskId : uint8_t { causal, bidirectional };

struct AttentionMaskKind {
  AttentionMaskId id;
  const char* name;  // TransformerConfig::attention_mask_type
};

inline constexpr AttentionMaskKind kAttentionMaskKinds[] = {
    {AttentionMaskId::causal, "causal"},                // decoders
    {AttentionMaskId::bidirectional, "bidirectional"},  // encoders (with an optional padding mask)
};
static_assert(ops::rows_in_id_order(kAttentionMaskKinds),
              "kAttentionMaskKinds: row i must be the kind with id i");

}  // namespace megatron::model

namespace megatron::model {

// ---- activation recomputation (--recompute-granularity, --recompute-method) --------------------
// TransformerConfig keeps the flag's value ("" when the flag is not given: Megatron's None);
// consumers ask for the id (recompute_granularity_id(), recompute_method_id()).
enum class RecomputeGranularityId : uint8_t { none, full, selective };

struct RecomputeGranularityKind {
  RecomputeGranularityId id;
  const char* name;   // the flag's value ("" for none)
  const char* label;  // in plans and messages
};

inline constexpr RecomputeGranularityKind kRecomputeGranularityKinds[] = {
    {RecomputeGranularityId::none, "", "none"},
    {RecomputeGranularityId::full, "full", "full"},            // whole layers, from their inputs
    {RecomputeGranularityId::selective, "selective", "selective"},  // the core attention only
};
static_assert(ops::rows_in_id_order(kRecomputeGranularityKinds),
              "kRecomputeGranularityKinds: row i must be the kind with id i");

enum class RecomputeMethodId : uint8_t { none, uniform, block };

struct RecomputeMethodKind {
  RecomputeMethodId id;
  const char* name;  // the flag's value ("" for none: only with full recomputation)
};

inline constexpr RecomputeMethodKind kRecomputeMethodKinds[] = {
    {RecomputeMethodId::none, ""},
    {RecomputeMethodId::uniform, "uniform"},  // groups of --recompute-num-layers layers
    {RecomputeMethodId::block, "block"},      // the first --recompute-num-layers layers of a stage
};
static_assert(ops::rows_in_id_order(kRecomputeMethodKinds),
              "kRecomputeMethodKinds: row i must be the kind with id i");

// ---- how context-parallel attention exchanges keys and values (--cp-comm-type) -----------------
// Megatron's choices; the all-to-all ones (heads exchanged) are refused by name (context_parallel.h).
enum class CpCommTypeId : uint8_t { p2p, a2a, allgather, a2a_p2p };

struct CpCommTypeKind {
  CpCommTypeId id;
  const char* name;  // the flag's value
  bool implemented;
};

inline constexpr CpCommTypeKind kCpCommTypeKinds[] = {
    {CpCommTypeId::p2p, "p2p", true},  // the ring (the default)
    {CpCommTypeId::a2a, "a2a", false},
    {CpCommTypeId::allgather, "allgather", true},
    {CpCommTypeId::a2a_p2p, "a2a+p2p", false},
};
static_assert(ops::rows_in_id_order(kCpCommTypeKinds),
              "kCpCommTypeKinds: row i must be the kind with id i");

// ---- the model family (TransformerConfig::model_family; model_family.h adds what builds it) ----
enum class ModelFamilyId : uint8_t { gpt, bert, t5 };

struct ModelFamilyKind {
  ModelFamilyId id;
  const char* name;  // TransformerConfig::model_family, metadata.json's value
};

inline constexpr ModelFamilyKind kModelFamilyKinds[] = {
    {ModelFamilyId::gpt, "gpt"},    // decoder-only language model
    {ModelFamilyId::bert, "bert"},  // bidirectional encoder with the masked-LM head
    {ModelFamilyId::t5, "t5"},      // encoder-decoder
};
static_assert(ops::rows_in_id_order(kModelFamilyKinds),
              "kModelFamilyKinds: row i must be the kind with id i");

// The names of ids (row lookups: the id is the index).
constexpr const char* kind_name(RecomputeGranularityId id) {
  return kRecomputeGranularityKinds[size_t(id)].name;
}
constexpr const char* kind_name(RecomputeMethodId id) { return kRecomputeMethodKinds[size_t(id)].name; }
constexpr const char* kind_name(CpCommTypeId id) { return kCpCommTypeKinds[size_t(id)].name; }
constexpr const char* kind_name(ModelFamilyId id) { return kModelFamilyKinds[size_t(id)].name; }

}  // namespace megatron::model
