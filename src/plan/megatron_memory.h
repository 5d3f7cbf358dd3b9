// Megatron-LM's theoretical memory footprint (megatron/training/theoretical_memory_usage.py,
// printed by training_log after the first logged iteration): the same formula, evaluated in the
// same order of operations, so every number equals Megatron's double for double, and the same
// lines. Megatron's assumptions, which this build's own prediction (memory_model.h) does not make:
//  - weights and optimizer: the most loaded shard (pipeline stage 0: 1/PP of the transformer
//    block, the final norm included, plus the word embedding, plus the output layer when PP = 1
//    and it is untied), divided by TP, at 18 bytes per parameter (bf16 weight, fp32 gradient,
//    fp32 main weight and two Adam moments), or 6 + 12 / DP with the distributed optimizer,
//    whatever the precision and optimizer of the run;
//  - activations of pipeline stage 0 with all L layers (not L / PP) in bf16: with sequence
//    parallelism and selective recomputation Korthikanti et al.'s s*b*h*(18 + 4 F/h) per layer
//    over TP; otherwise s*b*h*(10 + 24/TP) per layer and a 5% allowance; both add the embedding's
//    input and dropout mask for PP micro-batches in flight, scale by the interleaved schedule's
//    penalty 1 + (PP-1)/(PP*VP) or by min(1, M/PP) for 1F1B, and with PP = 1 add the output
//    layer's input and logits.
// Mixture of experts, as Megatron counts it: the layers --moe-layer-freq selects hold, in place
// of the dense MLP, num_experts MLPs of --moe-ffn-hidden-size (default --ffn-hidden-size) and the
// shared expert's (--moe-shared-expert-intermediate-size), with the SwiGLU factor 3/2; no router
// weights, no top-k and no expert-parallel division in the most loaded shard (every expert is on
// it); the activation formulas ignore the experts. Multi-token-prediction, multi-latent-attention
// and hybrid terms are zero: the trainer refuses those flags, and so does plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/layer_kinds.h"

namespace megatron::plan {

// The fields of Megatron's `args` that the formula reads, after Megatron's own argument
// processing (megatron_args_for in plan_config.h derives them from a run's flags).
struct MegatronMemoryArgs {
  int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0, kv_channels = 0;
  int64_t ffn_hidden_size = 0;
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  bool swiglu = false;
  // Mixture of experts: Megatron's None when the model has no MoE layers.
  std::optional<int64_t> num_experts;
  int64_t moe_ffn_hidden_size = 0;  // Megatron: --ffn-hidden-size unless given
  std::optional<int64_t> moe_shared_expert_intermediate_size;
  std::vector<int> moe_layer_pattern;  // --moe-layer-freq resolved: 1 per MoE layer
  std::string normalization = "LayerNorm";
  bool untie_embeddings_and_output_weights = false;
  int64_t padded_vocab_size = 0, seq_length = 0, micro_batch_size = 0;
  int64_t tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  std::optional<int64_t> virtual_pipeline_model_parallel_size;  // None without interleaving
  int64_t data_parallel_size = 1;
  bool use_distributed_optimizer = false;
  bool sequence_parallel = false;
  // Megatron's None is none
  model::RecomputeGranularityId recompute_granularity = model::RecomputeGranularityId::none;
};

struct MegatronMemoryReport {
  // Parameter counts as Megatron computes them (floats, as in Python).
  double transformer_block_parameters = 0, embedding_parameters = 0, total_parameters = 0;
  double most_loaded_shard_parameters = 0;
  std::optional<double> other_shard_parameters;  // PP > 1
  double bytes_per_parameter = 0;
  bool sequence_parallel_formula = false;  // compute_activation_memory (SP + selective)
  double weight_and_optimizer_bytes = 0, activation_bytes = 0;
  double weight_and_optimizer_mb = 0, activation_mb = 0, total_mb = 0;  // MiB, as Megatron's "MB"
  std::optional<int64_t> in_flight_microbatches;
  // What Megatron prints with verbose=True, line by line, ending with
  // "Theoretical memory footprints: weight and optimizer=... MB, activation=... MB, total=... MB".
  std::vector<std::string> lines;
};

// report_theoretical_memory(args, num_microbatches, verbose=True).
MegatronMemoryReport megatron_theoretical_memory(const MegatronMemoryArgs& args,
                                                 std::optional<int64_t> num_microbatches);

}  // namespace megatron::plan
