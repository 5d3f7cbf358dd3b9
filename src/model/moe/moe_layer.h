// The mixture-of-experts layer in a transformer layer's FFN slot (Megatron-Core's MoELayer):
//   router     logits = x W^T (W [E, h], "<prefix>.router.weight"), routed on the host in double
//              precision (routing.h): top-k experts and probabilities per token, capacity, the
//              load-balancing and z losses;
//   dispatcher rows permuted to the experts and combined back weighted by the probabilities
//              (token_dispatcher.h: the local dispatcher; an all-to-all one can replace it);
//   experts    one MLP per expert over its rows (experts.h: "<prefix>.experts.local_experts.<e>");
//   shared     optionally an MLP over every token ("<prefix>.shared_experts",
//              --moe-shared-expert-intermediate-size), added to the routed output.
// y = shared(x) + sum_k p_k expert_k(x). x and y are [N, h] (no sequence parallelism).
//
// The auxiliary losses do not enter the language-model loss: their gradients are added in
// backward multiplied by LayerContext::moe_aux_grad_scale (Megatron's MoEAuxLossAutoScaler), and
// their values are kept for the training log (take_statistics). Backward routes again from the
// saved logits (cheap, [N, E]) instead of keeping the routing, so the per-micro-batch stash holds
// only tensors. With --moe-router-enable-expert-bias the expert bias (a buffer, not a parameter)
// shifts the choice of experts and is updated after each step from the counted tokens.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/moe/experts.h"
#include "model/moe/routing.h"
#include "model/moe/token_dispatcher.h"

namespace megatron::model {

class TopKRouter : public Module {
 public:
  TopKRouter(const std::string& prefix, const TransformerConfig& cfg, bool grad);
  Weight weight;  // [E, h]
};

// What an MoE layer saw in training forwards since the last take_statistics(): the sums over
// micro-batches of the logged losses (divided by their coefficients) and the routed tokens per
// expert.
struct MoeStatistics {
  double load_balancing_loss = 0, z_loss = 0;
  std::vector<double> tokens_per_expert;
};

class MoELayer : public Module {
 public:
  MoELayer(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
           int layer, const TensorParallel& tp = TensorParallel::none(), bool grad = true);
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // [N, h] -> [N, h]
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx [N, h]

  MoeStatistics take_statistics();
  // The expert bias [E] (zeros until updated); empty without --moe-router-enable-expert-bias.
  const std::vector<double>& expert_bias() const { return expert_bias_; }
  void set_expert_bias(std::vector<double> bias);
  // Megatron's get_updated_expert_bias from the tokens per expert of the step (summed over the
  // ranks that saw different tokens).
  void update_expert_bias(const std::vector<double>& tokens_per_expert);
  // The routing of the last forward (tests, statistics).
  const Routing& last_routing() const { return last_routing_; }

  TopKRouter router;
  SequentialExperts experts;
  std::unique_ptr<MLP> shared_experts;

 private:
  // The logits the experts were chosen from, [N, E] on the host: the gate's, or random ones
  // under --moe-router-force-load-balancing.
  std::vector<double> routing_logits(const LayerContext& ctx, const std::vector<double>& gate) const;

  RouterSettings settings_;
  int layer_;
  bool force_balance_, expert_bias_enabled_;
  double bias_update_rate_;
  std::vector<double> expert_bias_;
  TokenDispatcher dispatcher_;
  MoeStatistics stats_;
  Routing last_routing_;
  SavedTensor x_{this, "x", "[N, h] layer input (the router's and the dispatch's)"};
  SavedTensor logits_{this, "logits", "[N, E] gate logits, fp32 on the host"};
  SavedTensor y_{this, "y", "[M, h] expert outputs before the probability weights (back at the "
                            "tokens' rank)"};
};

}  // namespace megatron::model
