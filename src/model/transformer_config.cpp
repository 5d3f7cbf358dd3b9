// Validation of the transformer configuration (see transformer_config.h).
#include "model/transformer_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/context_parallel.h"
#include "model/layer_spec.h"
#include "model/model_family.h"
#include "model/model_settings.h"

namespace megatron::model {

// metadata.json's "args"."model": every row of the settings table (model_settings.h) writes and
// reads its own keys, so a new setting is one row there.

void TransformerConfig::copy_moe_settings(const TransformerConfig& from) {
  for (const ModelSetting& s : model_settings()) {
    const std::string key = s.key;
    if (key == "num_moe_experts" || key.rfind("moe_", 0) == 0) s.copy(*this, from);
  }
}

void to_json(nlohmann::json& j, const TransformerConfig& c) {
  j = nlohmann::json::object();
  for (const ModelSetting& s : model_settings()) s.to_meta(c, j);
}

void from_json(const nlohmann::json& j, TransformerConfig& c) {
  c = TransformerConfig();
  for (const ModelSetting& s : model_settings()) s.from_meta(j, c);
  // Metadata written before "activation" was recorded: "gelu_tanh" (a bool) named the form, and
  // builds before that trained the exact (erf) form. Every reader of a checkpoint (resume,
  // generate, conversion, the .pt and Hugging Face writers) goes through here, so they agree.
  if (!j.contains("activation"))
    c.activation = j.contains("gelu_tanh") && j.at("gelu_tanh").get<bool>() ? "gelu_tanh" : "gelu";
}

std::string activation_from_flags(bool swiglu, bool squared_relu, bool openai_gelu,
                                  bool bias_gelu_fusion, bool add_bias_linear) {
  MG_REQUIRE(!(swiglu && squared_relu), "--swiglu and --squared-relu are mutually exclusive");
  if (swiglu) return "swiglu";
  if (squared_relu) return "squared_relu";
  if (openai_gelu) return "gelu_tanh";
  // Megatron turns the bias-GeLU fusion (the tanh form) off when the linears have no bias.
  return bias_gelu_fusion && add_bias_linear ? "gelu_tanh" : "gelu";
}

NormId TransformerConfig::norm_id() const { return norm_kind(normalization).id; }
ActivationId TransformerConfig::activation_id() const { return activation_kind(activation).id; }
PositionEmbeddingId TransformerConfig::position_embedding_id() const {
  return position_embedding_kind(position_embedding_type).id;
}
AttentionMaskId TransformerConfig::attention_mask_id() const {
  return attention_mask_kind(attention_mask_type).id;
}
ModelFamilyId TransformerConfig::family_id() const { return model_family_kind(model_family).id; }
RecomputeGranularityId TransformerConfig::recompute_granularity_id() const {
  return recompute_granularity_kind(recompute_granularity).id;
}
RecomputeMethodId TransformerConfig::recompute_method_id() const {
  return recompute_method_kind(recompute_method).id;
}
CpCommTypeId TransformerConfig::cp_comm_type_id() const { return parse_cp_comm_type(cp_comm_type); }

void TransformerConfig::validate() const {
  model_family_of(*this).validate(*this);  // an unknown family is an error listing the known ones
  MG_REQUIRE(num_layers > 0, "--num-layers must be > 0 (got ", num_layers, ")");
  MG_REQUIRE(hidden_size > 0, "--hidden-size must be > 0 (got ", hidden_size, ")");
  MG_REQUIRE(num_attention_heads > 0, "--num-attention-heads must be > 0");
  MG_REQUIRE(kv_channels > 0 || hidden_size % num_attention_heads == 0, "--hidden-size ",
             hidden_size, " is not divisible by --num-attention-heads ", num_attention_heads,
             "; set --kv-channels or change the sizes");
  MG_REQUIRE(num_query_groups >= 0 && num_attention_heads % query_groups() == 0,
             "--num-attention-heads ", num_attention_heads,
             " must be a multiple of --num-query-groups ", query_groups());
  MG_REQUIRE(ffn_hidden_size >= 0, "--ffn-hidden-size must be > 0 (got ", ffn_hidden_size, ")");
  MG_REQUIRE(seq_length > 0, "--seq-length must be > 0");
  MG_REQUIRE(max_position_embeddings >= seq_length,
             "--max-position-embeddings (", max_position_embeddings, ") must be >= --seq-length (",
             seq_length, ")");
  MG_REQUIRE(padded_vocab_size > 0, "padded vocabulary size must be > 0");
  MG_REQUIRE(hidden_dropout >= 0 && hidden_dropout < 1, "--hidden-dropout must be in [0, 1)");
  MG_REQUIRE(attention_dropout >= 0 && attention_dropout < 1,
             "--attention-dropout must be in [0, 1)");
  MG_REQUIRE(layernorm_epsilon > 0, "--norm-epsilon must be > 0 (got ", layernorm_epsilon, ")");
  MG_REQUIRE(params_dtype == DType::F32 || params_dtype == DType::BF16 ||
                 params_dtype == DType::F16,
             "params dtype must be float32, bfloat16 or float16");
  // The names resolve in the spec tables (errors list the valid names and the flag).
  (void)norm_kind(normalization);
  (void)activation_kind(activation);
  (void)position_embedding_kind(position_embedding_type);
  (void)attention_mask_kind(attention_mask_type);
  MG_REQUIRE(!relative_position_bias() || family_id() == ModelFamilyId::t5, "--position-embedding-type "
             "relative (the bucketed relative position bias) is T5's; the ", model_family,
             " family supports learned_absolute, rope, alibi or none");
  if (rope()) {
    MG_REQUIRE(rotary_percent > 0 && rotary_percent <= 1, "--rotary-percent must be in (0, 1] (got ",
               rotary_percent, ")");
    MG_REQUIRE(rotary_dim() >= 2 && rotary_dim() % 2 == 0, "--rotary-percent ", rotary_percent,
               " of the head size ", head_dim(), " rotates ", rotary_dim(),
               " dims; it must be an even number >= 2");
    MG_REQUIRE(rotary_base > 0, "--rotary-base must be > 0 (got ", rotary_base, ")");
  }
  MG_REQUIRE(window_left >= -1 && window_right >= -1, "--window-size values must be >= 0, or -1 "
             "for no limit (got ", window_left, " ", window_right, ")");
  MG_REQUIRE(!causal() || window_right <= 0, "--window-size: a causal model sees no key after "
             "its query, so the right side of the window must be 0 or -1 (got ", window_right, ")");
  parse_cp_comm_type(cp_comm_type);  // throws naming --cp-comm-type
  validate_moe();
  (void)recompute_granularity_id();  // an unknown name is an Error listing full, selective
  if (full_recompute()) {
    bool method = false;  // uniform or block
    for (const RecomputeMethodKind& k : kRecomputeMethodKinds)
      method = method || (k.id != RecomputeMethodId::none && recompute_method == k.name);
    MG_REQUIRE(method, "--recompute-granularity full needs --recompute-method uniform or block");
    MG_REQUIRE(recompute_num_layers >= 1 && recompute_num_layers <= num_layers,
               "--recompute-num-layers must be in [1, --num-layers=", num_layers, "] (got ",
               recompute_num_layers, ")");
  } else {
    MG_REQUIRE(recompute_method.empty(), "--recompute-method ", recompute_method,
               " requires --recompute-granularity full");
  }
}

void TransformerConfig::validate_tensor_parallel(int T) const {
  MG_REQUIRE(T >= 1, "--tensor-model-parallel-size must be >= 1 (got ", T, ")");
  if (T == 1) return;
  auto divisible = [&](int64_t v, const char* flag) {
    MG_REQUIRE(v % T == 0, flag, " ", v, " is not divisible by --tensor-model-parallel-size ", T,
               "; each tensor-parallel rank holds 1/", T, " of it");
  };
  divisible(hidden_size, "--hidden-size");
  divisible(num_attention_heads, "--num-attention-heads");
  divisible(query_groups(), num_query_groups > 0 ? "--num-query-groups" : "--num-attention-heads");
  divisible(ffn(), ffn_hidden_size > 0 ? "--ffn-hidden-size" : "4 * --hidden-size");
  MG_REQUIRE(padded_vocab_size % T == 0, "padded vocabulary size ", padded_vocab_size,
             " is not divisible by --tensor-model-parallel-size ", T,
             "; pad the vocabulary as Megatron does, to a multiple of "
             "--make-vocab-size-divisible-by * --tensor-model-parallel-size");
  if (num_moe_experts > 0) {
    divisible(moe_ffn(), moe_ffn_hidden_size > 0 ? "--moe-ffn-hidden-size" : "the expert FFN size");
    if (moe_shared_expert_intermediate_size > 0)
      divisible(moe_shared_expert_intermediate_size, "--moe-shared-expert-intermediate-size");
  }
  MG_REQUIRE(!sequence_parallel || seq_length % T == 0, "--seq-length ", seq_length,
             " is not divisible by --tensor-model-parallel-size ", T,
             " (required by --sequence-parallel: each rank holds seq-length / TP of the tokens)");
}

// Every attention mask splits over context-parallel ranks: the ranks' queries carry their
// positions in the whole sequence into the core attention op (model/context_parallel.h).
void TransformerConfig::validate_context_parallel(int C) const {
  MG_REQUIRE(C >= 1, "--context-parallel-size must be >= 1 (got ", C, ")");
}

}  // namespace megatron::model
