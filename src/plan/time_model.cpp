// Step-time estimate (time_model.h).
#include "plan/time_model.h"

#include <algorithm>
#include <cmath>

#include "model/layer_spec.h"
#include "plan/memory_model.h"
#include "training/metrics.h"

namespace megatron::plan {

namespace {

// A ring collective's half (reduce-scatter or all-gather) over n ranks of `bytes` in total.
double ring_half(double bytes, int n, const DeviceSpec& d) {
  if (n <= 1) return 0;
  return double(n - 1) * d.collective_latency +
         bytes * double(n - 1) / double(n) / d.interconnect_bandwidth;
}

double p2p(double bytes, const DeviceSpec& d) {
  return d.collective_latency + bytes / d.interconnect_bandwidth;
}

}  // namespace

StepTime estimate_step_time(const PlanInput& in, const DeviceSpec& dev) {
  const training::TrainingArgs& a = in.args;
  const model::TransformerConfig& m = a.model;
  const Layout& l = in.layout;
  const double h = m.hidden_size, s = m.seq_length, n = m.num_attention_heads;
  const double q = double(m.head_dim()) * n, kv = double(m.head_dim()) * m.query_groups();
  const double F = m.ffn(), V = double(m.padded_vocab_size);
  const bool gated = model::activation_kind(m.activation).gated;
  const double T = l.tp, C = l.cp, P = l.pp, VP = l.vp, M = double(in.num_microbatches);
  const double b = double(a.micro_batch_size);
  const double tokens = b * s;  // one micro-batch, whole sequence
  // The FFN width a token passes through, averaged over the layers: F in a dense layer, in an
  // MoE layer its top-k experts' widths and the shared expert's (the trainer's FLOPs count).
  const training::FlopsModel fm = training::flops_model(m);
  const double moe_share = double(fm.num_moe_layers) / double(m.num_layers);
  const double F_active =
      F * (1.0 - moe_share) + moe_share * double(fm.moe_ffn_hidden_size * fm.moe_router_topk +
                                                 fm.moe_shared_expert_intermediate_size);
  // Model FLOPs per token (forward + backward = 3 x forward), Megatron's terms, and the MoE
  // router's gate (which Megatron's count leaves out).
  const double mlp =
      6.0 * h * F_active * (gated ? 3.0 : 2.0) + moe_share * 6.0 * h * m.num_moe_experts;
  const double linear = 6.0 * (h * (q + 2 * kv) + q * h);
  // Megatron's causal attention term (the masked half skipped): 6 q s per token; twice that for
  // bidirectional attention.
  const double core = 6.0 * q * s * (m.causal() ? 1.0 : 2.0);
  const double head = 6.0 * h * V;
  double per_layer = mlp + linear + core;
  if (m.full_recompute()) per_layer += (mlp + linear + core) / 3.0;
  if (m.selective_recompute()) per_layer += core / 3.0;
  const double layers_per_stage = double(m.num_layers) / P;
  // Element-wise bytes per token and layer (forward + backward): norms, bias-dropout-adds and
  // residuals over h (sharded by TP only under SP), the activation over F, the softmax over the
  // keys of every local head.
  const double h_share = (m.sequence_parallel && T > 1) ? T : 1.0;
  // An MoE layer also moves its top-k rows per token: dispatch, the weighted combine and their
  // backward (about ten passes over [top-k, h] fp32).
  const double elementwise =
      3.0 * (48.0 * h / h_share + 12.0 * F_active * (gated ? 2.0 : 1.0) / T) +
      6.0 * 4.0 * (n / T) * s * (m.causal() ? 0.5 : 1.0) +
      moe_share * 40.0 * double(fm.moe_router_topk) * h;
  const double mb_tokens = tokens / C;  // this rank's tokens of one micro-batch
  // The products' rate at this layout's sizes: the geometric mean of a layer's four products
  // (QKV, projection, fc1, fc2) of this rank's rows and widths (the active FFN width).
  const double per_product =
      2.0 * mb_tokens * h *
      std::pow((q + 2 * kv) / T * (q / T) * (F_active * (gated ? 2 : 1) / T) * (F_active / T),
               0.25);
  const double rate = dev.achieved_flops(per_product), bw = dev.memory_bandwidth;
  auto stage_time = [&](bool first, bool last) {
    double flops = mb_tokens * layers_per_stage * per_layer / T;
    if (last) flops += mb_tokens * head / T;
    double bytes = mb_tokens * layers_per_stage * elementwise;
    if (first) bytes += mb_tokens * h * 16.0;
    return flops / rate + bytes / bw;
  };
  const double t_first = stage_time(true, P == 1), t_last = stage_time(P == 1, true);
  const double t_mid = stage_time(false, false);
  // Collectives of one micro-batch on one stage.
  const double act_bytes = mb_tokens * h * 4.0;  // a [b*s/CP, h] fp32 activation
  const double halves_per_layer = (m.sequence_parallel && T > 1) ? 10.0 : 8.0;
  const double tp = layers_per_stage * halves_per_layer * ring_half(act_bytes, l.tp, dev) +
                    4.0 * ring_half(act_bytes, l.tp, dev);  // embedding and loss head
  const double kv_bytes = mb_tokens * 2.0 * kv / T * 4.0;
  const double cp = l.cp > 1 ? layers_per_stage * 3.0 * (C - 1) * p2p(kv_bytes, dev) : 0;
  const double pp = l.pp > 1 ? 2.0 * VP * p2p(act_bytes / (m.sequence_parallel ? T : 1.0), dev) : 0;
  const double t_mb = std::max({t_first, t_last, t_mid}) + tp + cp + pp;
  StepTime st;
  st.compute = M * std::max({t_first, t_last, t_mid});
  st.tp_comm = M * tp;
  st.cp_comm = M * cp;
  st.pp_comm = M * pp;
  st.bubble = (P - 1.0) / VP * t_mb;
  // Data-parallel gradient reduction over DP x CP (and the distributed optimizer's gather).
  const MemoryPrediction mem = predict_memory(in);
  const double params = double(mem.worst().parameters);
  const int dp_cp = l.dp * l.cp;
  const double value_bytes = double(dtype_size(m.params_dtype));
  double dp = 0;
  if (dp_cp > 1)
    dp = l.distributed_optimizer
             ? ring_half(4.0 * params, dp_cp, dev) + ring_half(value_bytes * params, dp_cp, dev)
             : 2.0 * ring_half(4.0 * params, dp_cp, dev);
  if (a.parallel.overlap_grad_reduce) dp = std::max(0.0, dp - 2.0 / 3.0 * t_mb);
  st.dp_comm = dp;
  const double opt_params = l.distributed_optimizer ? params / double(dp_cp) : params;
  st.optimizer = (36.0 + value_bytes) * opt_params / bw + 12.0 * params / bw;
  st.total =
      st.compute + st.bubble + st.tp_comm + st.cp_comm + st.pp_comm + st.dp_comm + st.optimizer;
  st.model_flops = training::flops_per_iteration(fm, in.global_batch_size);
  st.tokens_per_second = double(in.global_batch_size) * s / st.total;
  st.tflops_per_device = st.model_flops / st.total / double(l.world()) / 1e12;
  st.mfu = dev.peak_flops > 0 ? st.tflops_per_device * 1e12 / dev.peak_flops : 0;
  return st;
}

}  // namespace megatron::plan
