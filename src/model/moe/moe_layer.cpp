// Forward and backward of the MoE layer (see moe_layer.h).
#include "model/moe/moe_layer.h"

#include <cmath>

#include "comm/communicator.h"
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

// out [N, h] = rows of y [N, h] each scaled by w [N] (a [N, 1, 1] batch of 1x1 products).
Tensor scale_rows(const Tensor& w, const Tensor& y) {
  const int64_t N = y.size(0), h = y.size(1);
  Tensor out = Tensor::empty({N, h}, DType::F32, y.device());
  if (N > 0) ops::gemm_batched(w.view({N, 1, 1}), false, y.view({N, 1, h}), false, out.view({N, 1, h}));
  return out;
}

// Sums v over `group` (in place); nothing for none or a group of one.
void sum_over(Communicator* group, std::vector<double>& v) {
  if (group == nullptr || group->size() == 1) return;
  Tensor t = Tensor::from_vector(v, {int64_t(v.size())});
  group->all_reduce(t, ReduceOp::Sum);
  v.assign(t.data<double>(), t.data<double>() + t.numel());
}

// The experts' tensor parallelism. Where every rank routes tokens of its own (sequence
// parallelism, or a tensor-parallel size of 1) the experts hold their shards of the expert
// tensor-parallel group and leave the communication to the token dispatcher (Megatron's
// explicit_expert_comm); otherwise (whole sequences on every TP rank) they are sharded and
// communicate as the dense MLP.
TensorParallel experts_tensor_parallel(const TensorParallel& tp) {
  const bool own_tokens = tp.sequence_parallel || tp.size() == 1;
  MG_REQUIRE(own_tokens || !tp.expert_tensor_parallel, "--expert-tensor-parallel-size ",
             tp.expert_tensor_parallel ? tp.expert_tensor_parallel->size() : 0,
             " differs from --tensor-model-parallel-size ", tp.size(), ": the experts then take "
             "tokens from other tensor-parallel ranks, which needs --sequence-parallel");
  if (!own_tokens) return tp;
  TensorParallel e = tp.experts();
  e.sequence_parallel = false;
  e.explicit_expert_comm = true;
  return e;
}

// The group the dispatcher gathers the experts' rows over: the experts' tensor-parallel group
// when they leave the communication to it.
std::shared_ptr<Communicator> dispatch_tensor_group(const TensorParallel& experts_tp) {
  return experts_tp.explicit_expert_comm && experts_tp.size() > 1 ? experts_tp.group : nullptr;
}

// The sequential experts' configuration: none when the grouped experts hold them.
TransformerConfig sequential_experts_config(const TransformerConfig& cfg) {
  TransformerConfig c = cfg;
  if (cfg.moe_grouped_gemm) c.num_moe_experts = 0;
  return c;
}

}  // namespace

TopKRouter::TopKRouter(const std::string& prefix, const TransformerConfig& cfg, bool partial_grad,
                       bool grad) {
  WeightSpec w;
  w.name = prefix + ".weight";
  w.init = InitMethod::normal;
  w.sequence_parallel = partial_grad;
  weight.init(w, {cfg.num_moe_experts, cfg.hidden_size}, cfg.params_dtype, grad);
  register_weight(weight);
}

MoELayer::MoELayer(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
                   int layer, const TensorParallel& tp, const ContextParallel& cp, bool grad)
    : router(prefix + ".router", cfg, tp.sequence_parallel, grad),
      experts(prefix + ".experts", sequential_experts_config(cfg), spec,
              experts_tensor_parallel(tp), grad),
      settings_(RouterSettings::of(cfg)),
      layer_(layer),
      force_balance_(cfg.moe_router_force_load_balancing),
      expert_bias_enabled_(cfg.moe_router_enable_expert_bias),
      bias_update_rate_(cfg.moe_router_bias_update_rate),
      sp_(tp.sequence_parallel ? tp.group : nullptr),
      cp_(cp.size() > 1 ? cp.group : nullptr),
      cp_rank_(cp.rank()),
      dispatcher_(parse_dispatcher_kind(cfg.moe_token_dispatcher_type), tp.expert_parallel,
                  cfg.num_moe_experts, dispatch_tensor_group(experts_tensor_parallel(tp))) {
  register_child(router);
  register_child(experts);
  if (cfg.moe_grouped_gemm) {
    grouped_experts = std::make_unique<GroupedExperts>(prefix + ".experts", cfg, spec,
                                                       experts_tensor_parallel(tp), grad);
    register_child(*grouped_experts);
  }
  if (cfg.moe_shared_expert_intermediate_size > 0) {
    shared_experts = std::make_unique<MLP>(prefix + ".shared_experts", cfg, spec, tp, grad,
                                           cfg.moe_shared_expert_intermediate_size);
    register_child(*shared_experts);
  }
  if (cfg.moe_shared_expert_gate) {
    MG_REQUIRE(shared_experts != nullptr, "--moe-shared-expert-gate needs a shared expert "
               "(--moe-shared-expert-intermediate-size)");
    WeightSpec g;
    g.name = prefix + ".shared_experts.gate_weight";
    g.init = InitMethod::normal;
    g.sequence_parallel = tp.sequence_parallel;  // computed on the rank's rows
    shared_expert_gate.init(g, {1, cfg.hidden_size}, cfg.params_dtype, grad);
    register_weight(shared_expert_gate);
  }
  if (expert_bias_enabled_) {
    expert_bias_.assign(size_t(cfg.num_moe_experts), 0.0);
    expert_bias_state_.name = prefix + ".router.expert_bias";
    expert_bias_state_.value = Tensor::zeros({cfg.num_moe_experts}, DType::F64, Device::cpu());
  }
  stats_.tokens_per_expert.assign(size_t(cfg.num_moe_experts), 0.0);
}

std::vector<double> MoELayer::routing_logits(const LayerContext& ctx,
                                             const std::vector<double>& gate,
                                             int64_t first_row) const {
  if (!force_balance_) return gate;
  // Megatron's apply_random_logits: standard normal logits, a pure function of the micro-batch,
  // the layer and the row, so recomputation and backward see the same choice.
  // Under context parallelism a row's number is its token's in the whole micro-batch.
  const ops::DropoutSpec d = ctx.dropout(0.5f, layer_, kSiteRouterRandomLogits);
  const Philox rng(d.seed, d.stream);
  const int E = settings_.num_experts;
  const int64_t N = int64_t(gate.size()) / E;
  std::vector<double> l(gate.size());
  for (int64_t x = 0; x < N; ++x) {
    int64_t row = first_row + x;
    if (cp_ && ctx.seq > 0)
      row = row / ctx.seq * ctx.seq * cp_size() +
            context_parallel_position(row % ctx.seq, ctx.seq, cp_rank_, cp_size());
    for (int e = 0; e < E; ++e) l[size_t(x * E + e)] = rng.normal(uint64_t(row * E + e));
  }
  return l;
}

Tensor MoELayer::forward(const LayerContext& ctx, const Tensor& x) {
  const int64_t N = x.size(0);
  const int E = settings_.num_experts;
  Tensor logits = Tensor::empty({N, E}, DType::F32, x.device());
  ops::gemm(x, false, router.weight.f32, true, logits);
  const Tensor host_logits = logits.to(Device::cpu());
  const std::vector<double> gate = to_host_doubles(host_logits);
  const std::vector<double> routed =
      routing_logits(ctx, gate, balance_geometry(ctx, N).first_row);
  const BalanceInputs balance = balance_inputs(ctx, routed, N, ctx.save);
  Routing r = route(routed, N, settings_, expert_bias_, ctx.training, balance);
  const TokenDispatcher::Plan plan = dispatcher_.plan(r, x.device());
  Tensor y = dispatcher_.return_rows(
      plan, experts_forward(ctx, dispatcher_.dispatch(plan, x), plan.expert_counts));
  Tensor out = dispatcher_.combine(plan, y);
  if (shared_experts) ops::add(out, out, shared_forward(ctx, x));
  if (ctx.save) {
    x_ = x;
    logits_ = host_logits;
    y_ = y;
    if (!balance.counts.empty()) {
      std::vector<double> g = balance.counts;
      g.push_back(balance.global_num_tokens);
      counts_ = Tensor::from_vector(g, {int64_t(g.size())});
    }
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
  BalanceInputs balance = balance_geometry(ctx, N);
  const std::vector<double> routed = routing_logits(ctx, gate, balance.first_row);
  if (counts_.defined()) {
    const Tensor& c = counts_;
    const double* g = c.data<double>();
    balance.counts.assign(g, g + c.numel() - 1);
    balance.global_num_tokens = g[c.numel() - 1];
  }
  const Routing r = route(routed, N, settings_, expert_bias_, ctx.training, balance);
  const TokenDispatcher::Plan plan = dispatcher_.plan(r, x.device());
  Tensor dx = Tensor::zeros(dy.shape(), DType::F32, dy.device());
  if (shared_experts) shared_backward(ctx, x, dy, dx);
  std::vector<double> dprobs;
  Tensor dyp = dispatcher_.combine_backward(plan, dy, y_, dprobs);
  dispatcher_.dispatch_backward(
      plan, experts_backward(ctx, dispatcher_.return_rows_backward(plan, dyp), plan.expert_counts),
      dx);
  std::vector<double> dlogits(size_t(N * E), 0.0);
  if (!force_balance_)
    dlogits = route_backward(routed, N, settings_, expert_bias_, dprobs, ctx.moe_aux_grad_scale,
                             balance);
  // Megatron divides the z-loss coefficient by the TP x CP size: each rank's mean is over its rows.
  if (settings_.z_loss_coeff > 0)
    z_loss_backward(gate, N, E,
                    ctx.moe_aux_grad_scale * settings_.z_loss_coeff / (sp_size() * cp_size()),
                    dlogits);
  const Tensor dl = to_device_floats(dlogits, {N, E}, x.device());
  if (router.weight.param.grad.defined())
    ops::gemm(dl, true, x, false, router.weight.param.grad, 1.0f, 1.0f);
  ops::gemm(dl, false, router.weight.f32, false, dx, 1.0f, 1.0f);
  x_.reset();
  logits_.reset();
  y_.reset();
  counts_.reset();
  return dx;
}

BalanceInputs MoELayer::balance_geometry(const LayerContext& ctx, int64_t N) const {
  BalanceInputs b;
  b.first_row = sp_ ? int64_t(sp_->rank()) * N : 0;
  b.rows = N * sp_size();
  b.sequences = ctx.batch > 0 && b.rows % ctx.batch == 0 ? ctx.batch : 1;
  b.context_parallel = cp_size();
  return b;
}

BalanceInputs MoELayer::balance_inputs(const LayerContext& ctx, const std::vector<double>& routed,
                                       int64_t N, bool commit) {
  BalanceInputs b = balance_geometry(ctx, N);
  const bool global = settings_.balancing == LoadBalancing::global_aux_loss;
  if (!ctx.training || !settings_.has_balancing_loss() || (!global && !sp_ && !cp_)) return b;
  // This rank's counts and tokens, summed over the tensor- and context-parallel ranks that hold
  // the other rows of the micro-batch (Megatron's reduction over tp_cp_group; tp_dp_cp_group for
  // global). Under context parallelism every rank holds a part of each of the batch's sequences,
  // so seq_aux_loss's per-sequence counts add up to the whole sequences'.
  std::vector<double> v = aux_loss_counts(routed, N, settings_, b);
  v.push_back(double(N));
  sum_over(sp_.get(), v);
  if (!global) sum_over(cp_.get(), v);  // global_aux_loss: dp_group_ holds the CP ranks
  if (!global) {
    v.pop_back();
    b.counts = std::move(v);
    return b;
  }
  // _apply_global_aux_loss: this micro-batch's counts summed over the data-parallel ranks too,
  // added to the step's; the loss uses their average over the micro-batches so far.
  sum_over(dp_group_, v);
  const size_t E = size_t(settings_.num_experts);
  std::vector<double> sum = global_tokens_;
  sum.resize(E, 0.0);
  for (size_t e = 0; e < E; ++e) sum[e] += v[e];
  const double steps = ga_steps_ + 1;
  if (commit) {
    global_tokens_ = sum;
    ga_steps_ = steps;
  }
  b.counts.resize(E);
  for (size_t e = 0; e < E; ++e) b.counts[e] = sum[e] / steps;
  b.global_num_tokens = v[E];
  return b;
}

Tensor MoELayer::experts_forward(const LayerContext& ctx, const Tensor& xp,
                                 const std::vector<int64_t>& counts) {
  return grouped_experts ? grouped_experts->forward(ctx, xp, counts) : experts.forward(ctx, xp, counts);
}

Tensor MoELayer::experts_backward(const LayerContext& ctx, const Tensor& dyp,
                                  const std::vector<int64_t>& counts) {
  return grouped_experts ? grouped_experts->backward(ctx, dyp, counts)
                         : experts.backward(ctx, dyp, counts);
}

Tensor MoELayer::shared_forward(const LayerContext& ctx, const Tensor& x) {
  Tensor y = shared_experts->forward(ctx, x);
  if (!shared_expert_gate.defined()) return y;
  // SharedExpertMLP's gate: y * sigmoid(x g^T), per token.
  const int64_t N = x.size(0);
  Tensor logit = Tensor::empty({N, 1}, DType::F32, x.device());
  ops::gemm(x, false, shared_expert_gate.f32, true, logit);
  std::vector<double> g = to_host_doubles(logit);
  for (double& v : g) v = 1.0 / (1.0 + std::exp(-v));
  const Tensor gate = to_device_floats(g, {N, 1}, x.device());
  if (ctx.save) {
    shared_y_ = y;
    gate_ = gate;
  }
  return scale_rows(gate, y);
}

void MoELayer::shared_backward(const LayerContext& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (!shared_expert_gate.defined()) {
    ops::add(dx, dx, shared_experts->backward(ctx, dy));
    return;
  }
  const int64_t N = x.size(0), h = x.size(1);
  const Tensor y = shared_y_, gate = gate_;
  ops::add(dx, dx, shared_experts->backward(ctx, scale_rows(gate, dy)));
  // d(logit) = <dy, y> * s (1 - s) per token; then dg += dlogit^T x, dx += dlogit g.
  Tensor dot = Tensor::empty({N, 1, 1}, DType::F32, dy.device());
  if (N > 0) ops::gemm_batched(dy.view({N, 1, h}), false, y.view({N, 1, h}), true, dot);
  std::vector<double> d = to_host_doubles(dot.view({N, 1}));
  const std::vector<double> s = to_host_doubles(gate);
  for (size_t i = 0; i < d.size(); ++i) d[i] *= s[i] * (1 - s[i]);
  const Tensor dl = to_device_floats(d, {N, 1}, x.device());
  if (shared_expert_gate.param.grad.defined())
    ops::gemm(dl, true, x, false, shared_expert_gate.param.grad, 1.0f, 1.0f);
  ops::gemm(dl, false, shared_expert_gate.f32, false, dx, 1.0f, 1.0f);
  shared_y_.reset();
  gate_.reset();
}

MoeStatistics MoELayer::take_statistics() {
  MoeStatistics s = std::move(stats_);
  stats_ = MoeStatistics();
  global_tokens_.clear();
  ga_steps_ = 0;
  const size_t E = size_t(settings_.num_experts);
  stats_.tokens_per_expert.assign(E, 0.0);
  if (sp_) {  // the ranks' rows: counts and loss shares summed, the z-loss means averaged
    std::vector<double> v = s.tokens_per_expert;
    v.push_back(s.load_balancing_loss);
    v.push_back(s.z_loss);
    sum_over(sp_.get(), v);
    s.tokens_per_expert.assign(v.begin(), v.begin() + long(E));
    s.load_balancing_loss = v[E];
    s.z_loss = v[E + 1] / sp_size();
  }
  return s;
}

void MoELayer::set_expert_bias(std::vector<double> bias) {
  MG_REQUIRE(expert_bias_enabled_ && int(bias.size()) == settings_.num_experts,
             "expert bias: ", bias.size(), " values for a layer ",
             expert_bias_enabled_ ? "with " + std::to_string(settings_.num_experts) + " experts"
                                  : std::string("without --moe-router-enable-expert-bias"));
  expert_bias_ = std::move(bias);
}

void MoELayer::sync_expert_bias_state() {
  if (!expert_bias_enabled_) return;
  std::copy(expert_bias_.begin(), expert_bias_.end(), expert_bias_state_.value.data<double>());
}

void MoELayer::load_expert_bias_state() {
  if (!expert_bias_enabled_) return;
  const double* v = expert_bias_state_.value.data<double>();
  expert_bias_.assign(v, v + expert_bias_state_.value.numel());
}

void MoELayer::update_expert_bias(const std::vector<double>& tokens_per_expert) {
  if (!expert_bias_enabled_) return;
  megatron::model::update_expert_bias(expert_bias_, tokens_per_expert, bias_update_rate_);
}

}  // namespace megatron::model
