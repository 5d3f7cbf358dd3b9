// Forward and backward of the MLP (see mlp.h): ops::activation_fwd / activation_bwd with the
// kind from the spec; its row says whether it is gated.
#include "model/mlp.h"

#include "kernels/ops.h"

namespace megatron::model {

namespace {

LinearOptions fc_options(bool bias, int parts, bool grad, InitMethod init = InitMethod::normal) {
  LinearOptions o;
  o.bias = bias;
  o.parts = parts;
  o.grad = grad;
  o.init = init;
  return o;
}

}  // namespace

MLP::MLP(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
         const TensorParallel& tp, bool grad, int ffn_hidden)
    : activation(*spec.activation),
      linear_fc1(prefix + ".linear_fc1", cfg.hidden_size,
                 int64_t(ffn_hidden > 0 ? ffn_hidden : cfg.ffn()) * (spec.activation->gated ? 2 : 1),
                 cfg.params_dtype, tp,
                 fc_options(cfg.add_bias_linear, spec.activation->gated ? 2 : 1, grad)),
      linear_fc2(prefix + ".linear_fc2", ffn_hidden > 0 ? ffn_hidden : cfg.ffn(), cfg.hidden_size,
                 cfg.params_dtype, tp,
                 fc_options(cfg.add_bias_linear, 1, grad, InitMethod::scaled_normal)) {
  register_child(linear_fc1);
  register_child(linear_fc2);
}

Tensor MLP::forward(const LayerContext& ctx, const Tensor& x) {
  Tensor h1 = linear_fc1.forward(ctx, x);
  const int64_t width = activation.gated ? h1.size(1) / 2 : h1.size(1);
  // Written in fc2's operand dtype (bf16 products: no fp32 copy and cast).
  Tensor a1 = Tensor::empty({h1.size(0), width}, linear_fc2.input_dtype(), h1.device());
  ops::activation_fwd(activation.id, a1, h1);
  Tensor y = linear_fc2.forward(ctx, a1);
  if (ctx.save) {
    h1_ = h1;
    a1_ = a1;
  }
  return y;
}

Tensor MLP::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(h1_.defined(), "MLP::backward without a saved forward");
  Tensor da = linear_fc2.backward(ctx, dy);
  Tensor dh = activation.gated ? Tensor::empty(h1_.get().shape(), DType::F32, da.device()) : da;
  ops::activation_bwd(activation.id, dh, da, h1_);
  h1_.reset();
  a1_.reset();
  return linear_fc1.backward(ctx, dh);
}

}  // namespace megatron::model
