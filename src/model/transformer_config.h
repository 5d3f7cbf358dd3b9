// The transformer's configuration (Megatron-Core's TransformerConfig): sizes, regularisation,
// precision, recomputation, parallel switches, and the architecture choices that the layer spec
// (layer_spec.h) turns into modules: normalization, activation, position embedding, attention
// mask, biases, tied or untied output layer. Field names and defaults are Megatron's flags
// (--num-layers -> num_layers, ...). A GPT-2-style model is the default; a Llama-style one is
// normalization "RMSNorm", activation "swiglu", position_embedding_type "rope", grouped-query
// attention, add_bias_linear false and untie_embeddings_and_output_weights true.
//
// The configuration is recorded in checkpoints (training/checkpoint.cpp serialises every field),
// so a model is always rebuilt with the settings it was trained with.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "model/layer_kinds.h"

namespace megatron::model {

struct TransformerConfig {
  // ---- the model family (its kind: family_id(); model_family.h): "gpt" (decoder-only language
  // model), "bert" (bidirectional encoder with the masked-LM head, and the pooler and
  // sentence-order head unless bert_binary_head is false: --bert-no-binary-head) or "t5".
  std::string model_family = kind_name(ModelFamilyId::gpt);
  bool bert_binary_head = true;
  // ---- T5 (model family "t5"): num_layers is the encoder's depth (Megatron's --num-layers or
  // --encoder-num-layers) and seq_length its sequence (--encoder-seq-length); the decoder has
  // decoder_num_layers layers (--decoder-num-layers; 0: num_layers) over decoder_seq_length
  // tokens (--decoder-seq-length). With position_embedding_type "relative", the bucketed
  // relative position bias (--relative-attention-num-buckets, --relative-attention-max-distance).
  int decoder_num_layers = 0;
  int decoder_seq_length = 0;
  int relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
  int decoder_layers() const { return decoder_num_layers > 0 ? decoder_num_layers : num_layers; }
  bool relative_position_bias() const {
    return position_embedding_id() == PositionEmbeddingId::relative;
  }

  // ---- sizes
  int num_layers = 0, hidden_size = 0, num_attention_heads = 0;
  int ffn_hidden_size = 0;  // 0 -> 4h
  int kv_channels = 0;      // 0 -> h / n
  int num_query_groups = 0; // 0 -> num_attention_heads (no GQA); --num-query-groups
  int seq_length = 0, max_position_embeddings = 0;
  int64_t padded_vocab_size = 0;

  // ---- architecture (layer_spec.h resolves the names; unknown names are errors naming the flag)
  std::string normalization = "LayerNorm";  // --normalization: LayerNorm | RMSNorm
  float layernorm_epsilon = 1e-5f;          // --norm-epsilon (--layernorm-epsilon)
  bool apply_layernorm_1p = false;          // --apply-layernorm-1p: weight stored as gamma - 1 (init 0)
  // The MLP activation: "gelu_tanh" (Megatron's default: bias-GeLU fusion computes the tanh
  // form; also --openai-gelu), "gelu" (exact erf: --no-bias-gelu-fusion, or --disable-bias-linear,
  // which turns the fusion off in Megatron), "swiglu" (--swiglu), "squared_relu" (--squared-relu).
  std::string activation = "gelu_tanh";
  // --position-embedding-type: learned_absolute | rope | alibi | none (--no-position-embedding)
  // | relative (T5 only).
  std::string position_embedding_type = "learned_absolute";
  float rotary_percent = 1.0f;   // --rotary-percent: fraction of each head's dims rotated
  double rotary_base = 10000.0;  // --rotary-base
  bool rotary_interleaved = false;  // --rotary-interleaved
  // Attention mask: "causal" (decoders) or "bidirectional" (encoders; a key padding mask may
  // come with the batch).
  std::string attention_mask_type = "causal";
  // Sliding window (--window-size LEFT RIGHT; the Ascend scripts' --pre-tockens / --next-tockens):
  // a query at position i attends keys in [i - window_left, i + window_right]; -1 = unbounded
  // (a causal mask bounds the right side at 0).
  int64_t window_left = -1, window_right = -1;
  bool qk_layernorm = false;      // --qk-layernorm: the norm over each query and key head
  bool add_bias_linear = true;    // --disable-bias-linear turns it off
  bool add_qkv_bias = false;      // --add-qkv-bias: QKV bias even without add_bias_linear
  bool untie_embeddings_and_output_weights = false;  // --untie-embeddings-and-output-weights

  // ---- regularisation and init
  float hidden_dropout = 0.1f, attention_dropout = 0.1f;
  float init_method_std = 0.02f;
  bool apply_query_key_layer_scaling = false;  // mathematically a no-op in fp32 softmax

  // ---- precision and memory
  DType params_dtype = DType::F32;
  // Their kinds: recompute_granularity_id(), recompute_method_id() (layer_kinds.h).
  std::string recompute_granularity;  // "", "full", "selective"
  std::string recompute_method;       // "", "uniform", "block" (full only)
  int recompute_num_layers = 0;

  // ---- parallelism
  // --sequence-parallel: LayerNorm/dropout/residual regions hold seq/T of the tokens. Ignored
  // (as Megatron does) when the tensor-parallel size is 1.
  bool sequence_parallel = false;
  // --cp-comm-type: how context-parallel attention exchanges keys and values ("p2p", the ring,
  // or "allgather"; context_parallel.h; its kind: cp_comm_type_id()). Same results, different
  // communication.
  std::string cp_comm_type = kind_name(CpCommTypeId::p2p);

  // ---- mixture of experts (model/moe/): Megatron-Core's MoE settings, by their flags. With
  // num_moe_experts > 0 the FFN slot of the layers moe_layer_freq selects is an MoE layer.
  int num_moe_experts = 0;                 // --num-experts (0: dense model)
  std::string moe_layer_freq = "1";        // --moe-layer-freq: an int k (every k-th layer) or a list
  int moe_ffn_hidden_size = 0;             // --moe-ffn-hidden-size (0 -> ffn())
  int moe_router_topk = 2;                 // --moe-router-topk
  std::string moe_router_score_function = "softmax";  // --moe-router-score-function
  bool moe_router_pre_softmax = false;     // --moe-router-pre-softmax
  float moe_router_topk_scaling_factor = 0;  // --moe-router-topk-scaling-factor (0: none)
  int moe_router_num_groups = 0, moe_router_group_topk = 0;  // group-limited routing (0: off)
  bool moe_router_enable_expert_bias = false;  // --moe-router-enable-expert-bias
  float moe_router_bias_update_rate = 1e-3f;   // --moe-router-bias-update-rate
  bool moe_router_force_load_balancing = false;  // --moe-router-force-load-balancing
  std::string moe_router_load_balancing_type = "aux_loss";  // --moe-router-load-balancing-type
  float moe_aux_loss_coeff = 0;            // --moe-aux-loss-coeff
  float moe_z_loss_coeff = 0;              // --moe-z-loss-coeff (0: none)
  float moe_expert_capacity_factor = 0;    // --moe-expert-capacity-factor (0: no capacity)
  std::string moe_token_drop_policy = "probs";  // --moe-token-drop-policy probs | position
  bool moe_pad_expert_input_to_capacity = false;  // --moe-pad-expert-input-to-capacity
  int moe_shared_expert_intermediate_size = 0;    // --moe-shared-expert-intermediate-size (0: none)
  bool moe_shared_expert_gate = false;            // --moe-shared-expert-gate: sigmoid gate on it
  bool moe_grouped_gemm = false;  // --moe-grouped-gemm: grouped experts (their own weight names)
  // How tokens reach the experts of other expert-parallel ranks (--moe-token-dispatcher-type
  // allgather | alltoall; the same numbers either way, and no effect at EP = 1).
  std::string moe_token_dispatcher_type = "allgather";
  int moe_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn(); }
  // Whether layer `layer` (0-based, global) has an MoE FFN (moe_layer_pattern, model/moe/).
  bool is_moe_layer(int layer) const;
  // The checks of the MoE settings (validate() calls it); errors name the flags.
  void validate_moe() const;
  void copy_moe_settings(const TransformerConfig& from);  // every MoE field above

  int ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // The kinds of the named settings (model/layer_kinds.h); an unknown name is an Error listing
  // the valid ones.
  NormId norm_id() const;
  ActivationId activation_id() const;
  PositionEmbeddingId position_embedding_id() const;
  AttentionMaskId attention_mask_id() const;
  ModelFamilyId family_id() const;
  RecomputeGranularityId recompute_granularity_id() const;
  RecomputeMethodId recompute_method_id() const;
  CpCommTypeId cp_comm_type_id() const;
  bool full_recompute() const { return recompute_granularity_id() == RecomputeGranularityId::full; }
  bool selective_recompute() const {
    return recompute_granularity_id() == RecomputeGranularityId::selective;
  }
  bool causal() const { return attention_mask_id() == AttentionMaskId::causal; }
  bool learned_position_embedding() const {
    return position_embedding_id() == PositionEmbeddingId::learned_absolute;
  }
  bool rope() const { return position_embedding_id() == PositionEmbeddingId::rope; }
  bool alibi() const { return position_embedding_id() == PositionEmbeddingId::alibi; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  // Rotated dims per head: head_dim * rotary_percent (Megatron's int() truncation).
  int rotary_dim() const { return int(float(head_dim()) * rotary_percent); }

  // Throws megatron::Error naming the inconsistent flag.
  void validate() const;
  // The checks that depend on the tensor-parallel size T (--tensor-model-parallel-size): hidden
  // size, heads, query groups, FFN size and padded vocabulary divisible by T; under sequence
  // parallelism the sequence length too. Throws megatron::Error naming the flags.
  void validate_tensor_parallel(int tp_size) const;
  // The checks that depend on the context-parallel size (every attention mask splits over
  // context-parallel ranks); throws megatron::Error naming the flag.
  void validate_context_parallel(int cp_size) const;
};

// The activation Megatron's flags select (see TransformerConfig::activation): --swiglu,
// --squared-relu, --openai-gelu, else the fused bias-GeLU (tanh form) unless
// --no-bias-gelu-fusion or --disable-bias-linear turned the fusion off (exact erf GeLU).
std::string activation_from_flags(bool swiglu, bool squared_relu, bool openai_gelu,
                                  bool bias_gelu_fusion, bool add_bias_linear);

// The checkpoint codec (metadata.json "args"."model"): every field by its name. Reading fills
// fields a checkpoint lacks with their defaults, and maps the older "gelu_tanh" flag to the
// activation it recorded.
void to_json(nlohmann::json& j, const TransformerConfig& c);
void from_json(const nlohmann::json& j, TransformerConfig& c);

}  // namespace megatron::model
