// Layer specs (Megatron-Core's ModuleSpec / TransformerLayerSubmodules): what each part of a
// transformer layer is, chosen per model from the configuration. The layer's composition is fixed
// (pre-norm -> self-attention -> bias-dropout-add -> pre-MLP norm -> MLP -> bias-dropout-add);
// the spec picks the kind of each part from tables:
//   - norms (NormKind): LayerNorm, RMSNorm — --normalization;
//   - activations (ActivationKind): gelu, gelu_tanh, swiglu (gated), squared_relu — selected by
//     Megatron's flags (--swiglu, --squared-relu, --openai-gelu, --no-bias-gelu-fusion);
//   - attention: causal or bidirectional mask, rotary / ALiBi positions, a sliding window, the
//     optional per-head query/key norm.
// Adding a norm or an activation is one entry in the table of layer_spec.cpp plus its op
// (kernels/ops.h and its CPU kernel): the CLI, the recorded-settings checks and their messages
// take the names and flags from these tables.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/transformer_config.h"

namespace megatron::model {

// A normalization over the last dimension. fwd writes out and, when defined, the statistics
// backward needs (mean and rstd for LayerNorm, rstd only for RMSNorm); bwd writes or accumulates
// dx and accumulates dweight / dbias (undefined when the norm has no bias).
struct NormKind {
  const char* name;  // the --normalization value
  bool has_bias;
  bool saves_mean;
  void (*fwd)(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& weight, const Tensor& bias, float eps);
  void (*bwd)(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
              const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
              bool accumulate_dx);
};

// The MLP's activation between linear_fc1 and linear_fc2. A gated one (GLU) takes fc1's output
// of 2F columns per tensor-parallel rank, [gate | up], and gives F.
struct ActivationKind {
  const char* name;  // TransformerConfig::activation
  const char* flag;  // a Megatron flag of its own that selects it ("" for the GeLU forms)
  const char* help;
  const char* display;    // in messages: "SwiGLU"
  const char* asked_by;   // the flag that asks for it, for messages ("--openai-gelu" for tanh GeLU)
  bool gated;
  void (*fwd)(const Tensor& out, const Tensor& x);
  void (*bwd)(const Tensor& dx, const Tensor& dout, const Tensor& x);  // dx may alias dout unless gated
};

// Lookups by name; an unknown name is a megatron::Error listing the valid ones.
const NormKind& norm_kind(const std::string& name);
const ActivationKind& activation_kind(const std::string& name);
const std::vector<NormKind>& norm_kinds();
const std::vector<ActivationKind>& activation_kinds();

struct AttentionSpec {
  bool causal = true;               // else bidirectional (with an optional key padding mask)
  bool rope = false;                // rotary embedding of queries and keys
  bool alibi = false;               // ALiBi score bias
  const NormKind* qk_norm = nullptr;  // per-head norm of queries and keys (--qk-layernorm)
};

struct MlpSpec {
  const ActivationKind* activation = nullptr;
};

struct TransformerLayerSpec {
  const NormKind* input_layernorm = nullptr;
  AttentionSpec self_attention;
  const NormKind* pre_mlp_layernorm = nullptr;
  MlpSpec mlp;
};

// The spec of a GPT decoder layer (Megatron-Core's get_gpt_layer_local_spec) for `cfg`.
TransformerLayerSpec gpt_layer_spec(const TransformerConfig& cfg);

}  // namespace megatron::model
