// The spec tables: every norm and activation a model can be built with, each bound to its ops.
#include "model/layer_spec.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace megatron::model {

namespace {

void layernorm_fwd(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                   const Tensor& w, const Tensor& b, float eps) {
  ops::layernorm_fwd(out, mean, rstd, x, w, b, eps);
}
void layernorm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   bool acc) {
  ops::layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, acc);
}

void rmsnorm_fwd(const Tensor& out, const Tensor&, const Tensor& rstd, const Tensor& x,
                 const Tensor& w, const Tensor&, float eps) {
  ops::rmsnorm_fwd(out, rstd, x, w, eps);
}
void rmsnorm_bwd(const Tensor& dx, const Tensor& dw, const Tensor&, const Tensor& dout,
                 const Tensor& x, const Tensor& w, const Tensor&, const Tensor& rstd, bool acc) {
  ops::rmsnorm_bwd(dx, dw, dout, x, w, rstd, acc);
}

void gelu_fwd(const Tensor& out, const Tensor& x) { ops::gelu_fwd(out, x, false); }
void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  ops::gelu_bwd(dx, dout, x, false);
}
void gelu_tanh_fwd(const Tensor& out, const Tensor& x) { ops::gelu_fwd(out, x, true); }
void gelu_tanh_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  ops::gelu_bwd(dx, dout, x, true);
}

template <class Kind>
std::string names(const std::vector<Kind>& kinds) {
  std::string s;
  for (const Kind& k : kinds) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

}  // namespace

const std::vector<NormKind>& norm_kinds() {
  static const std::vector<NormKind> kinds = {
      {"LayerNorm", true, true, layernorm_fwd, layernorm_bwd},
      {"RMSNorm", false, false, rmsnorm_fwd, rmsnorm_bwd},
  };
  return kinds;
}

const std::vector<ActivationKind>& activation_kinds() {
  static const std::vector<ActivationKind> kinds = {
      {"gelu_tanh", "", "GeLU, tanh form (Megatron's default fused bias-GeLU; --openai-gelu)",
       "GeLU (tanh form)", "--openai-gelu", false, gelu_tanh_fwd, gelu_tanh_bwd},
      {"gelu", "", "GeLU, exact erf form (--no-bias-gelu-fusion, or --disable-bias-linear)",
       "GeLU (exact erf form)", "--no-bias-gelu-fusion", false, gelu_fwd, gelu_bwd},
      {"swiglu", "--swiglu", "SwiGLU MLP: silu(gate) * up, fc1 gives [gate | up]", "SwiGLU",
       "--swiglu", true, ops::swiglu_fwd, ops::swiglu_bwd},
      {"squared_relu", "--squared-relu", "Squared ReLU activation", "squared ReLU",
       "--squared-relu", false, ops::squared_relu_fwd, ops::squared_relu_bwd},
  };
  return kinds;
}

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
