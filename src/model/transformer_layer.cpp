// Forward and backward of a decoder layer (see transformer_layer.h).
#include "model/transformer_layer.h"

namespace megatron::model {

namespace {

std::string layer_prefix(const std::string& block, int i) {
  return block + ".layers." + std::to_string(i);
}

NormOptions norm_options(const TransformerConfig& cfg, const TensorParallel& tp, bool grad) {
  NormOptions o;
  o.eps = cfg.layernorm_epsilon;
  o.zero_centered_gamma = cfg.apply_layernorm_1p;
  o.partial_grad = tp.sequence_parallel;
  o.grad = grad;
  return o;
}

// Bias-dropout-add over x's rows with the masks of the same rows of the unsharded [N, h] tensor:
// x is rank r's row block under sequence parallelism, and its rows are scattered over the whole
// sequence under context parallelism (LayerContext::for_each_sequence_run).
int64_t first_row(const TensorParallel& tp, const Tensor& x) {
  return tp.sequence_parallel ? int64_t(tp.rank()) * x.size(0) : 0;
}
void bda_fwd(const LayerContext& ctx, int64_t row0, const Tensor& out, const Tensor& x,
             const Tensor& bias, const Tensor& residual, float p, int layer, int site) {
  ctx.for_each_sequence_run(row0, x.size(0), x.size(1), [&](int64_t f, int64_t n, uint64_t off) {
    ops::bias_dropout_add_fwd(out.narrow(0, f, n), x.narrow(0, f, n), bias,
                              residual.narrow(0, f, n), ctx.dropout(p, layer, site, off));
  });
}
void bda_bwd(const LayerContext& ctx, int64_t row0, const Tensor& dx, const Tensor& dbias,
             const Tensor& dout, float p, int layer, int site) {
  ctx.for_each_sequence_run(row0, dx.size(0), dx.size(1), [&](int64_t f, int64_t n, uint64_t off) {
    ops::bias_dropout_add_bwd(dx.narrow(0, f, n), dbias, dout.narrow(0, f, n),
                              ctx.dropout(p, layer, site, off));
  });
}
const Tensor& bias_of(const Weight& w) {
  static const Tensor none;
  return w.defined() ? w.f32 : none;
}
const Tensor& bias_grad_of(const Weight& w) {
  static const Tensor none;
  return w.defined() ? w.param.grad : none;
}

// The FFN slot of `spec` (constructed in place: modules do not move).
std::variant<MLP, MoELayer> make_ffn(const std::string& prefix, const TransformerConfig& cfg,
                                     const TransformerLayerSpec& spec, int index,
                                     const TensorParallel& tp, const ContextParallel& cp, bool grad) {
  if (spec.ffn == FfnKind::moe)
    return std::variant<MLP, MoELayer>(std::in_place_type<MoELayer>, prefix, cfg, spec.mlp, index,
                                       tp, cp, grad);
  return std::variant<MLP, MoELayer>(std::in_place_type<MLP>, prefix, cfg, spec.mlp, tp, grad);
}
// The bias the layer's bias-dropout-add adds after the FFN: the dense MLP's fc2 bias (the MoE
// layer has none).
const Weight* ffn_bias(const std::variant<MLP, MoELayer>& ffn) {
  const MLP* m = std::get_if<MLP>(&ffn);
  return m != nullptr && m->linear_fc2.bias.defined() ? &m->linear_fc2.bias : nullptr;
}

}  // namespace

TransformerLayer::TransformerLayer(int idx, const TransformerConfig& cfg,
                                   const TransformerLayerSpec& spec, const TensorParallel& tp_,
                                   const ContextParallel& cp, bool grad,
                                   const std::string& block)
    : index(idx),
      hidden_dropout(cfg.hidden_dropout),
      tp(tp_),
      input_layernorm(layer_prefix(block, idx) + ".input_layernorm", cfg.hidden_size,
                      *spec.input_layernorm, cfg.params_dtype, norm_options(cfg, tp_, grad)),
      self_attention(layer_prefix(block, idx) + ".self_attention", cfg, spec.self_attention, idx, tp_, cp,
                     grad),
      pre_mlp_layernorm(layer_prefix(block, idx) + ".pre_mlp_layernorm", cfg.hidden_size,
                        *spec.pre_mlp_layernorm, cfg.params_dtype, norm_options(cfg, tp_, grad)),
      mlp(make_ffn(layer_prefix(block, idx) + ".mlp", cfg, spec, idx, tp_, cp, grad)) {
  register_child(input_layernorm);
  register_child(self_attention);
  if (spec.pre_cross_attn_layernorm) {
    pre_cross_attn_layernorm = std::make_unique<Norm>(
        layer_prefix(block, idx) + ".pre_cross_attn_layernorm", cfg.hidden_size,
        *spec.pre_cross_attn_layernorm, cfg.params_dtype, norm_options(cfg, tp_, grad));
    cross_attention = std::make_unique<CrossAttention>(layer_prefix(block, idx) + ".cross_attention",
                                                       cfg, idx, tp_, grad);
    register_child(*pre_cross_attn_layernorm);
    register_child(*cross_attention);
  }
  register_child(pre_mlp_layernorm);
  std::visit([this](Module& m) { register_child(m); }, mlp);
  // Under expert parallelism the layer holds only its rank's experts (two weights each).
  const size_t other_experts =
      spec.ffn == FfnKind::moe ? 2 * size_t(cfg.num_moe_experts - cfg.num_moe_experts / tp_.ep_size()) : 0;
  MG_CHECK(parameters().size() + other_experts == count_parameters(cfg, spec),
           "TransformerLayer::count_parameters disagrees with the layer built from the same spec");
}

size_t TransformerLayer::count_parameters(const TransformerConfig& cfg,
                                          const TransformerLayerSpec& spec) {
  auto norm = [](const NormKind* k) { return size_t(k->has_bias ? 2 : 1); };
  const size_t linear = cfg.add_bias_linear ? 2 : 1;
  // MoE: the router, two weights per expert, two per shared expert (no biases) and its gate.
  const size_t ffn = spec.ffn == FfnKind::moe
                         ? 1 + 2 * size_t(cfg.num_moe_experts) +
                               (cfg.moe_shared_expert_intermediate_size > 0 ? 2 : 0) +
                               (cfg.moe_shared_expert_gate ? 1 : 0)
                         : 2 * linear;
  return norm(spec.input_layernorm) + (cfg.qkv_bias() ? 2 : 1) +
         (spec.self_attention.qk_norm ? 2 * norm(spec.self_attention.qk_norm) : 0) + linear +
         norm(spec.pre_mlp_layernorm) + ffn +
         (spec.pre_cross_attn_layernorm ? norm(spec.pre_cross_attn_layernorm) + 3 * linear : 0);
}

Tensor TransformerLayer::forward(const LayerContext& ctx, const Tensor& x) {
  const int64_t row0 = first_row(tp, x);
  // The norms whose outputs feed only a product write them in its operand dtype (bf16 products:
  // bf16, no fp32 copy and cast).
  Tensor a = input_layernorm.forward(ctx, x, self_attention.linear_qkv.input_dtype());
  Tensor attn = self_attention.forward(ctx, a);
  Tensor x2 = Tensor::empty(x.shape(), DType::F32, x.device());
  bda_fwd(ctx, row0, x2, attn, bias_of(self_attention.linear_proj.bias), x, hidden_dropout, index,
          kSiteAttentionOut);
  if (cross_attention) {
    Tensor c = pre_cross_attn_layernorm->forward(ctx, x2, cross_attention->linear_q.input_dtype());
    Tensor ca = cross_attention->forward(ctx, c);
    Tensor x3 = Tensor::empty(x.shape(), DType::F32, x.device());
    bda_fwd(ctx, row0, x3, ca, bias_of(cross_attention->linear_proj.bias), x2, hidden_dropout,
            index, kSiteCrossAttentionOut);
    x2 = x3;
  }
  const MLP* dense = std::get_if<MLP>(&mlp);  // the MoE router reads the norm's output in fp32
  Tensor m = pre_mlp_layernorm.forward(ctx, x2,
                                       dense ? dense->linear_fc1.input_dtype() : DType::F32);
  Tensor mo = std::visit([&](auto& f) { return f.forward(ctx, m); }, mlp);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const Weight* fb = ffn_bias(mlp);
  bda_fwd(ctx, row0, y, mo, fb ? fb->f32 : Tensor(), x2, hidden_dropout, index,
          kSiteMlpOut);
  if (ctx.save) {
    x_ = x;
    x2_ = x2;
  }
  return y;
}

Tensor TransformerLayer::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(x2_.defined(), "TransformerLayer::backward without a saved forward");
  const int64_t row0 = first_row(tp, dy);
  // MLP branch: y = x2 + drop(mlp(ln2(x2)) + b)
  Tensor dmo = Tensor::empty(dy.shape(), DType::F32, dy.device());
  const Weight* fb = ffn_bias(mlp);
  bda_bwd(ctx, row0, dmo, fb ? fb->param.grad : Tensor(), dy, hidden_dropout, index,
          kSiteMlpOut);
  Tensor dm = std::visit([&](auto& f) { return f.backward(ctx, dmo); }, mlp);
  Tensor dx2 = dy.clone();
  pre_mlp_layernorm.backward_accumulate(ctx, dm, dx2);
  if (cross_attention) {  // x2 += drop(cross_attention(ln(x2)) + b)
    Tensor dca = Tensor::empty(dy.shape(), DType::F32, dy.device());
    bda_bwd(ctx, row0, dca, bias_grad_of(cross_attention->linear_proj.bias), dx2, hidden_dropout,
            index, kSiteCrossAttentionOut);
    Tensor dc = cross_attention->backward(ctx, dca);
    pre_cross_attn_layernorm->backward_accumulate(ctx, dc, dx2);
  }
  // Attention branch: x2 = x + drop(attn(ln1(x)) + b)
  Tensor dattn = dmo;  // reuse the buffer
  bda_bwd(ctx, row0, dattn, bias_grad_of(self_attention.linear_proj.bias), dx2, hidden_dropout,
          index, kSiteAttentionOut);
  Tensor da = self_attention.backward(ctx, dattn);
  input_layernorm.backward_accumulate(ctx, da, dx2);
  x_.reset();
  x2_.reset();
  return dx2;
}

}  // namespace megatron::model
