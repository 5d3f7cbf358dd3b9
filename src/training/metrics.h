// Training metrics: Megatron's FLOPs-per-iteration formula (spec §6.3, current vintage with the
// causal halving of the attention term) and the per-interval log line (spec §6.1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_chunk.h"
#include "model/transformer_config.h"

namespace megatron::training {

struct FlopsModel {
  int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0, kv_channels = 0;
  int64_t num_query_groups = 0, ffn_hidden_size = 0, seq_length = 0, padded_vocab_size = 0;
  bool swiglu = false;
  // Mixture of experts (Megatron's num_floating_point_operations counts the experts a token is
  // routed to, plus the shared expert): the MoE layers among num_layers, and their widths.
  int64_t num_moe_layers = 0, moe_ffn_hidden_size = 0, moe_router_topk = 0;
  int64_t moe_shared_expert_intermediate_size = 0;
};
double flops_per_iteration(const FlopsModel& m, int64_t global_batch_size);
// The FlopsModel of a model's configuration (its MoE layers from --moe-layer-freq).
FlopsModel flops_model(const model::TransformerConfig& c);

struct IntervalStats {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0;
  double elapsed_ms_per_iter = 0;
  bool log_throughput = false;
  double tflops_per_device = 0;
  double learning_rate = 0;
  std::optional<double> decoupled_learning_rate;  // --decoupled-lr: the embedding/output layer's
  int64_t global_batch_size = 0;                   // this iteration's (it ramps up with a schedule)
  double lm_loss = 0;
  // The family's further losses after "lm loss" ("sop loss" for BERT), printed in this order.
  std::vector<std::pair<std::string, double>> more_losses;
  double loss_scale = 1.0;
  double grad_norm = 0;  // NaN when no advanced iteration in the interval
  int64_t skipped_iterations = 0, nan_iterations = 0;
  double tokens_per_second = 0;
};
std::string format_log_line(const IntervalStats& s);  // with the [timestamp] prefix
// A family's named losses with their values (sum / max(count, 1) of each loss's sums).
using NamedLosses = std::vector<std::pair<std::string, double>>;
NamedLosses named_losses(const std::vector<std::string>& names, const model::LossResult& sums);
// Megatron's evaluate_and_print_results line: " validation loss at PREFIX | lm loss value: ... |
// lm loss PPL: ... |" and the same for every further loss (PREFIX "iteration N" in the loop,
// "iteration N on validation set" / "... on test set" after training or --skip-train).
std::string format_evaluation_line(const std::string& prefix, const NamedLosses& losses);
std::string format_validation_line(int64_t iteration, const NamedLosses& losses);
// The same for the language-model loss alone.
std::string format_evaluation_line(const std::string& prefix, double loss);
std::string format_validation_line(int64_t iteration, double loss);

}  // namespace megatron::training
