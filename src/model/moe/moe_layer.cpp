// Forward and backward of the MoE layer (see moe_layer.h).
#include "model/moe/moe_layer.h"

#include "core/rng.h"
#include "kernels/ops.h"

namespace megatron::model {

namespace {

constexpr int kSiteRouterRandomLogits = 14;  // the dropout-stream site of forced balancing

std::vector<double> to_host_doubles(const Tensor& t) {
  const Tensor h = t.contiguous().to(Device::cpu());
  const float* p = h.data<float>();
  return std::vector<double>(p, p + h.numel());
}

Tensor to_device_floats(const std::vector<double>& v, const Shape& shape, Device device) {
  return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), shape, device);
}

}  // namespace

TopKRouter::TopKRouter(const std::string& prefix, const TransformerConfig& cfg, bool grad) {
  WeightSpec w;
  w.name = prefix + ".weight";
  w.init = InitMethod::normal;
  weight.init(w, {cfg.num_moe_experts, cfg.hidden_size}, cfg.params_dtype, grad);
  register_weight(weight);
}

MoELayer::MoELayer(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
                   int layer, const TensorParallel& tp, bool grad)
    : router(prefix + ".router", cfg, grad),
      experts(prefix + ".experts", cfg, spec, tp, grad),
      settings_(RouterSettings::of(cfg)),
      layer_(layer),
      force_balance_(cfg.moe_router_force_load_balancing),
      expert_bias_enabled_(cfg.moe_router_enable_expert_bias),
      bias_update_rate_(cfg.moe_router_bias_update_rate),
      dispatcher_(parse_dispatcher_kind(cfg.moe_token_dispatcher_type), tp.expert_parallel,
                  cfg.num_moe_experts) {
  register_child(router);
  register_child(experts);
  if (cfg.moe_shared_expert_intermediate_size > 0) {
    shared_experts = std::make_unique<MLP>(prefix + ".shared_experts", cfg, spec, tp, grad,
                                           cfg.moe_shared_expert_intermediate_size);
    register_child(*shared_experts);
  }
  if (expert_bias_enabled_) expert_bias_.assign(size_t(cfg.num_moe_experts), 0.0);
  stats_.tokens_per_expert.assign(size_t(cfg.num_moe_experts), 0.0);
}

std::vector<double> MoELayer::routing_logits(const LayerContext& ctx,
                                             const std::vector<double>& gate) const {
  if (!force_balance_) return gate;
  // Megatron's apply_random_logits: standard normal logits, a pure function of the micro-batch
  // and the layer, so recomputation and backward see the same choice.
  const ops::DropoutSpec d = ctx.dropout(0.5f, layer_, kSiteRouterRandomLogits);
  const Philox rng(d.seed, d.stream);
  std::vector<double> l(gate.size());
  for (size_t i = 0; i < l.size(); ++i) l[i] = rng.normal(i);
  return l;
}

Tensor MoELayer::forward(const LayerContext& ctx, const Tensor& x) {
  const int64_t N = x.size(0);
  const int E = settings_.num_experts;
  Tensor logits = Tensor::empty({N, E}, DType::F32, x.device());
  ops::gemm(x, false, router.weight.f32, true, logits);
  const Tensor host_logits = logits.to(Device::cpu());
  const std::vector<double> gate = to_host_doubles(host_logits);
  Routing r = route(routing_logits(ctx, gate), N, settings_, expert_bias_, ctx.training);
  const TokenDispatcher::Plan plan = dispatcher_.plan(r, x.device());
  Tensor y = dispatcher_.return_rows(
      plan, experts.forward(ctx, dispatcher_.dispatch(plan, x), plan.expert_counts));
  Tensor out = dispatcher_.combine(plan, y);
  if (shared_experts) ops::add(out, out, shared_experts->forward(ctx, x));
  if (ctx.save) {
    x_ = x;
    logits_ = host_logits;
    y_ = y;
    // Statistics once per micro-batch (a recomputed forward saves; its first pass does not).
    if (ctx.training) {
      stats_.load_balancing_loss += r.load_balancing_loss;
      if (settings_.z_loss_coeff > 0) stats_.z_loss += z_loss(gate, N, E);
      for (int e = 0; e < E; ++e) stats_.tokens_per_expert[size_t(e)] += double(r.tokens_per_expert[size_t(e)]);
    }
  }
  last_routing_ = std::move(r);
  return out;
}

Tensor MoELayer::backward(const LayerContext& ctx, const Tensor& dy) {
  MG_CHECK(x_.defined(), "MoELayer::backward without a saved forward");
  const Tensor x = x_;
  const int64_t N = x.size(0);
  const int E = settings_.num_experts;
  const std::vector<double> gate = to_host_doubles(logits_);
  const std::vector<double> routed = routing_logits(ctx, gate);
  const Routing r = route(routed, N, settings_, expert_bias_, ctx.training);
  const TokenDispatcher::Plan plan = dispatcher_.plan(r, x.device());
  Tensor dx = shared_experts ? shared_experts->backward(ctx, dy)
                             : Tensor::zeros(dy.shape(), DType::F32, dy.device());
  std::vector<double> dprobs;
  Tensor dyp = dispatcher_.combine_backward(plan, dy, y_, dprobs);
  dispatcher_.dispatch_backward(
      plan, experts.backward(ctx, dispatcher_.return_rows_backward(plan, dyp), plan.expert_counts),
      dx);
  std::vector<double> dlogits(size_t(N * E), 0.0);
  if (!force_balance_)
    dlogits = route_backward(routed, N, settings_, expert_bias_, dprobs, ctx.moe_aux_grad_scale);
  if (settings_.z_loss_coeff > 0)
    z_loss_backward(gate, N, E, ctx.moe_aux_grad_scale * settings_.z_loss_coeff, dlogits);
  const Tensor dl = to_device_floats(dlogits, {N, E}, x.device());
  if (router.weight.param.grad.defined())
    ops::gemm(dl, true, x, false, router.weight.param.grad, 1.0f, 1.0f);
  ops::gemm(dl, false, router.weight.f32, false, dx, 1.0f, 1.0f);
  x_.reset();
  logits_.reset();
  y_.reset();
  return dx;
}

MoeStatistics MoELayer::take_statistics() {
  MoeStatistics s = std::move(stats_);
  stats_ = MoeStatistics();
  stats_.tokens_per_expert.assign(size_t(settings_.num_experts), 0.0);
  return s;
}

void MoELayer::set_expert_bias(std::vector<double> bias) {
  MG_REQUIRE(expert_bias_enabled_ && int(bias.size()) == settings_.num_experts,
             "expert bias: ", bias.size(), " values for a layer ",
             expert_bias_enabled_ ? "with " + std::to_string(settings_.num_experts) + " experts"
                                  : std::string("without --moe-router-enable-expert-bias"));
  expert_bias_ = std::move(bias);
}

void MoELayer::update_expert_bias(const std::vector<double>& tokens_per_expert) {
  if (!expert_bias_enabled_) return;
  megatron::model::update_expert_bias(expert_bias_, tokens_per_expert, bias_update_rate_);
}

}  // namespace megatron::model
