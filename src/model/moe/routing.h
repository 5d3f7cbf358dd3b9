// The router's arithmetic (Megatron-Core's TopKRouter.routing with topk_softmax_with_capacity,
// group_limited_topk, switch_load_balancing_loss_func and z_loss_func), on the host in double
// precision over the gate's logits [N, E]: which experts each token goes to, with which
// probability, the load-balancing losses, and the gradient of the logits from the gradient of
// the probabilities plus the losses' injected gradients (MoEAuxLossAutoScaler).
//
// The logits of a micro-batch are small ([tokens, experts]); the token counts per expert must
// reach the host anyway to size the experts' products, so routing there costs one small copy.
// Ties in a top-k choose the lower index first (a token's experts, and the tokens an expert keeps
// under a capacity).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer_config.h"

namespace megatron::model {

// --moe-router-load-balancing-type: Megatron's aux_loss (per micro-batch), seq_aux_loss (per
// sequence, averaged over the sequences), global_aux_loss (the token counts summed over the
// data-parallel ranks and averaged over the step's micro-batches so far), sinkhorn (training-time
// Sinkhorn choice, no loss), none.
enum class LoadBalancing { none, aux_loss, seq_aux_loss, global_aux_loss, sinkhorn };
LoadBalancing load_balancing_of(const std::string& type);  // throws on an unknown name
// The name of the logged loss: load_balancing_loss, seq_load_balancing_loss,
// global_load_balancing_loss; empty for sinkhorn and none.
const char* load_balancing_loss_name(LoadBalancing b);

struct RouterSettings {
  int num_experts = 0, topk = 1;
  bool sigmoid = false;  // --moe-router-score-function sigmoid (else softmax)
  bool pre_softmax = false;
  double scaling_factor = 0;  // 0: none
  int num_groups = 0, group_topk = 0;  // group-limited routing when group_topk > 0
  double capacity_factor = 0;          // 0: no capacity
  bool drop_by_position = false;       // --moe-token-drop-policy position (else probs)
  bool pad_to_capacity = false;
  LoadBalancing balancing = LoadBalancing::aux_loss;
  double aux_loss_coeff = 0, z_loss_coeff = 0;
  // A load-balancing loss is computed (in training): an aux-loss type with a coefficient.
  bool has_balancing_loss() const;
  static RouterSettings of(const TransformerConfig& cfg);
};

// What the load-balancing losses need besides this rank's logits [N, E]. The N rows are rows
// [first_row, first_row + N) of the micro-batch's `rows` rows (0: N; under sequence parallelism
// each tensor-parallel rank routes its row block), which form `sequences` sequences of
// S = rows / sequences tokens, row b * S + s (seq_aux_loss). counts: the loss's top-k token
// counts when they are taken over more tokens than these rows, summed over the ranks that hold
// them (Megatron's reduction of tokens_per_expert): aux_loss [E] over the micro-batch,
// seq_aux_loss [sequences, E] (both over the tensor-parallel group under sequence parallelism),
// global_aux_loss [E] averaged over the step's micro-batches so far (each summed over the
// tensor x data-parallel ranks that hold different tokens); empty: counted from these logits.
// global_num_tokens: the tokens of one micro-batch over those ranks (global_aux_loss's T).
// The loss route() returns is then this rank's share: the ranks' shares sum to the loss.
// context_parallel: the context-parallel ranks C over which every sequence is split; the rows are
// then this rank's part of the micro-batch (S / C tokens of each sequence), the counts summed over
// the C ranks too, and the losses normalised by the whole micro-batch's tokens (rows x C).
struct BalanceInputs {
  int64_t sequences = 1;
  int64_t first_row = 0, rows = 0;
  int64_t context_parallel = 1;
  std::vector<double> counts;
  double global_num_tokens = 0;
};

// One micro-batch's routing. probs and map are [N, E] row-major: probs[x*E + e] is token x's
// weight for expert e (0 where it is not routed there), map[x*E + e] whether x goes to e (with
// pad_to_capacity also the padding slots of an expert, whose weight is 0).
struct Routing {
  int64_t num_tokens = 0;
  int num_experts = 0;
  std::vector<double> probs;
  std::vector<uint8_t> map;
  std::vector<int64_t> tokens_per_expert;  // column sums of map
  // The load-balancing loss as Megatron logs it (divided by its coefficient), and as it enters
  // the gradient (with it); 0 when not computed.
  double load_balancing_loss = 0, aux_loss_scaled = 0;
};

// Routes `logits` [N, E]. expert_bias: [E] added to the sigmoid scores for the choice only, or
// empty. `training`: the auxiliary losses are computed (Megatron skips them outside training).
// Under sinkhorn, training chooses the experts from the Sinkhorn-normalised logits (Megatron's
// sinkhorn, tolerance 1e-4), evaluation by the scores.
Routing route(const std::vector<double>& logits, int64_t num_tokens, const RouterSettings& s,
              const std::vector<double>& expert_bias, bool training,
              const BalanceInputs& balance = {});

// d(loss)/d(logits) [N, E]: dprobs [N, E] is the gradient of Routing::probs; the
// load-balancing loss's gradient is added multiplied by aux_grad_scale (MoEAuxLossAutoScaler's
// main_loss_backward_scale).
std::vector<double> route_backward(const std::vector<double>& logits, int64_t num_tokens,
                                   const RouterSettings& s, const std::vector<double>& expert_bias,
                                   const std::vector<double>& dprobs, double aux_grad_scale,
                                   const BalanceInputs& balance = {});

// This rank's share of the load-balancing loss's token counts (compute_routing_scores_for_aux_loss's
// top-k of the normalised scores, no capacity): [E], or [sequences, E] under seq_aux_loss with
// the rows placed by balance.first_row. What the ranks sum into BalanceInputs::counts.
std::vector<double> aux_loss_counts(const std::vector<double>& logits, int64_t num_tokens,
                                    const RouterSettings& s, const BalanceInputs& balance);

// Megatron's sinkhorn(cost, tol=1e-4) over [N, E] (at most 10000 rounds: it converges in a few
// dozen on any finite input).
std::vector<double> sinkhorn(const std::vector<double>& logits, int64_t num_tokens, int num_experts);

// z_loss_func without its coefficient: mean over tokens of logsumexp(logits)^2; and the
// gradient of scale * that mean added into dlogits.
double z_loss(const std::vector<double>& logits, int64_t num_tokens, int num_experts);
void z_loss_backward(const std::vector<double>& logits, int64_t num_tokens, int num_experts,
                     double scale, std::vector<double>& dlogits);

// Megatron's get_updated_expert_bias: bias += rate * sign(mean(tokens) - tokens), per expert.
void update_expert_bias(std::vector<double>& bias, const std::vector<double>& tokens_per_expert,
                        double rate);

// Megatron's get_capacity: ceil(tokens / experts * capacity_factor).
int64_t expert_capacity(int64_t num_tokens, int num_experts, double capacity_factor);

}  // namespace megatron::model
