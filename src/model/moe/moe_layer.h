// The mixture-of-experts layer in a transformer layer's FFN slot (Megatron-Core's MoELayer):
//   router     logits = x W^T (W [E, h], "<prefix>.router.weight"), routed on the host in double
//              precision (routing.h): top-k experts and probabilities per token, capacity, the
//              load-balancing and z losses;
//   dispatcher rows permuted to the experts and combined back weighted by the probabilities
//              (token_dispatcher.h: the local dispatcher; an all-to-all one can replace it);
//   experts    one MLP per expert over its rows (experts.h: "<prefix>.experts.local_experts.<e>"),
//              or with --moe-grouped-gemm all of them as grouped products (grouped_experts.h:
//              "<prefix>.experts.linear_fc1.weight<e>");
//   shared     optionally an MLP over every token ("<prefix>.shared_experts",
//              --moe-shared-expert-intermediate-size), added to the routed output; with
//              --moe-shared-expert-gate scaled per token by sigmoid(x g^T) (g [1, h],
//              "<prefix>.shared_experts.gate_weight", Megatron-Core's SharedExpertMLP gate).
// y = shared(x) + sum_k p_k expert_k(x). x and y are [N, h], or under sequence parallelism this
// tensor-parallel rank's row block [N/T, h], as Megatron-Core's MoE layer takes them: the router
// routes the rank's own rows (its weight's gradient is a partial sum over TP, Parameter::
// sequence_parallel), the load-balancing losses use the token counts summed over the group and
// each rank adds its rows' share (the z-loss's coefficient divided by T), the dispatcher gathers
// the rows of the tensor x expert group for the experts, which hold their TP shards and leave
// all communication to it (TensorParallel::explicit_expert_comm), and the shared expert is an MLP
// under sequence parallelism (its gate weight's gradient a partial sum). The capacity, as in
// Megatron, is then taken over the rank's rows. With --expert-tensor-parallel-size of its own
// (TensorParallel::expert_tensor_parallel, Megatron's parallel folding) the experts are sharded
// over that group instead, and the dispatcher gathers over it. Under context parallelism x is
// this rank's slice of every sequence ([b * S/C, h]): the load-balancing counts are summed over
// the context-parallel group too (seq_aux_loss's per sequence), each rank's loss is its tokens'
// share of the loss over the whole sequences, and the z-loss coefficient is divided by TP x C.
//
// The auxiliary losses do not enter the language-model loss: their gradients are added in
// backward multiplied by LayerContext::moe_aux_grad_scale (Megatron's MoEAuxLossAutoScaler), and
// their values are kept for the training log (take_statistics). Backward routes again from the
// saved logits (cheap, [N, E]) instead of keeping the routing, so the per-micro-batch stash holds
// only tensors. With --moe-router-enable-expert-bias the expert bias (a buffer, not a parameter)
// shifts the choice of experts and is updated after each step from the counted tokens; it is
// saved in checkpoints as "<prefix>.router.expert_bias" (float64, so a resume is bit-exact).
// global_aux_loss keeps the step's token counts (Megatron's global_tokens_per_expert and
// ga_steps), summed over the tensor-parallel group under sequence parallelism and the
// data-parallel group set by set_data_parallel_group (Megatron's tp_dp_cp group).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/moe/experts.h"
#include "model/moe/grouped_experts.h"
#include "model/moe/routing.h"
#include "model/moe/token_dispatcher.h"

namespace megatron::model {

class TopKRouter : public Module {
 public:
  // partial_grad: the router sees a sequence shard (its gradient is summed over TP).
  TopKRouter(const std::string& prefix, const TransformerConfig& cfg, bool partial_grad, bool grad);
  Weight weight;  // [E, h]
};

// What an MoE layer saw in training forwards since the last take_statistics(): the sums over
// micro-batches of the logged losses (divided by their coefficients; the load-balancing loss of
// the configured type) and the routed tokens per expert.
struct MoeStatistics {
  double load_balancing_loss = 0, z_loss = 0;
  std::vector<double> tokens_per_expert;
};

class MoELayer : public Module {
 public:
  MoELayer(const std::string& prefix, const TransformerConfig& cfg, const MlpSpec& spec,
           int layer, const TensorParallel& tp = TensorParallel::none(),
           const ContextParallel& cp = ContextParallel::none(), bool grad = true);
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // [N, h] -> [N, h]
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx [N, h]

  // Takes the statistics and resets the step's global_aux_loss counts (Megatron's
  // reset_model_temporary_tensors). Under sequence parallelism they are summed over the
  // tensor-parallel group first (collective there), so they cover the micro-batches' whole rows.
  MoeStatistics take_statistics();
  int layer_number() const { return layer_; }  // 0-based, over the whole model
  // The group over which global_aux_loss sums the token counts (data x context parallel); null:
  // this rank alone. Not owned.
  void set_data_parallel_group(Communicator* group) { dp_group_ = group; }
  // The expert bias as checkpoints hold it (float64 [E]): sync_expert_bias_state() before saving,
  // load_expert_bias_state() after loading. Null without --moe-router-enable-expert-bias.
  Parameter* expert_bias_state() { return expert_bias_enabled_ ? &expert_bias_state_ : nullptr; }
  void sync_expert_bias_state();
  void load_expert_bias_state();
  // The expert bias [E] (zeros until updated); empty without --moe-router-enable-expert-bias.
  const std::vector<double>& expert_bias() const { return expert_bias_; }
  void set_expert_bias(std::vector<double> bias);
  // Megatron's get_updated_expert_bias from the tokens per expert of the step (summed over the
  // ranks that saw different tokens).
  void update_expert_bias(const std::vector<double>& tokens_per_expert);
  // The routing of the last forward (tests, statistics).
  const Routing& last_routing() const { return last_routing_; }

  TopKRouter router;
  SequentialExperts experts;  // no experts with --moe-grouped-gemm
  std::unique_ptr<GroupedExperts> grouped_experts;
  std::unique_ptr<MLP> shared_experts;
  Weight shared_expert_gate;  // [1, h]; undefined without --moe-shared-expert-gate

 private:
  // The logits the experts were chosen from, [N, E] on the host: the gate's, or random ones
  // under --moe-router-force-load-balancing.
  std::vector<double> routing_logits(const LayerContext& ctx, const std::vector<double>& gate,
                                     int64_t first_row) const;
  // The load-balancing loss's inputs of this micro-batch: the token counts summed over the
  // tensor-parallel group under sequence parallelism; global_aux_loss sums them over the
  // data-parallel group too and, when `commit`, adds them to the step's counts.
  BalanceInputs balance_inputs(const LayerContext& ctx, const std::vector<double>& routed,
                               int64_t N, bool commit);
  // The micro-batch geometry of this rank's N rows (BalanceInputs without the counts).
  BalanceInputs balance_geometry(const LayerContext& ctx, int64_t N) const;
  int sp_size() const { return sp_ ? sp_->size() : 1; }
  int cp_size() const { return cp_ ? cp_->size() : 1; }
  Tensor experts_forward(const LayerContext& ctx, const Tensor& xp, const std::vector<int64_t>& counts);
  Tensor experts_backward(const LayerContext& ctx, const Tensor& dyp, const std::vector<int64_t>& counts);
  Tensor shared_forward(const LayerContext& ctx, const Tensor& x);
  void shared_backward(const LayerContext& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);

  RouterSettings settings_;
  int layer_;
  bool force_balance_, expert_bias_enabled_;
  double bias_update_rate_;
  std::vector<double> expert_bias_;
  Parameter expert_bias_state_;
  std::shared_ptr<Communicator> sp_;  // the TP group under sequence parallelism, else null
  std::shared_ptr<Communicator> cp_;  // the context-parallel group of more than one rank, else null
  int cp_rank_ = 0;
  Communicator* dp_group_ = nullptr;
  std::vector<double> global_tokens_;  // global_aux_loss: the step's summed counts
  double ga_steps_ = 0;
  TokenDispatcher dispatcher_;
  MoeStatistics stats_;
  Routing last_routing_;
  SavedTensor x_{this, "x", "[N, h] layer input (the router's and the dispatch's)"};
  SavedTensor logits_{this, "logits", "[N, E] gate logits, fp32 on the host"};
  SavedTensor y_{this, "y", "[M, h] expert outputs before the probability weights (back at the "
                            "tokens' rank)"};
  SavedTensor counts_{this, "counts", "[G * E + 1] f64 the load-balancing counts summed over "
                                      "ranks (BalanceInputs::counts), then global_num_tokens"};
  SavedTensor shared_y_{this, "shared_y", "[N, h] shared expert output before its gate"};
  SavedTensor gate_{this, "gate", "[N, 1] sigmoid of the shared expert's gate"};
};

}  // namespace megatron::model
