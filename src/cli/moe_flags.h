// Megatron's mixture-of-experts flags (megatron/training/arguments.py _add_moe_args) for the
// training command: the MoE settings of model::TransformerConfig, and the ones this build does
// not have yet (FP64 routing, several load-balancing types), refused by
// check() with an error naming them.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "model/transformer_config.h"
#include "training/trainer.h"

namespace megatron::cli {

struct MoeFlags {
  int expert_model_parallel_size = 1;
  int expert_tensor_parallel_size = 0;  // 0: not given (Megatron: the tensor-parallel size)
  std::string token_dispatcher_type = "allgather";
  std::string router_dtype;
  std::vector<std::string> load_balancing_type, aux_loss_coeff;  // Megatron: nargs '+'
  bool grouped_gemm = false, shared_expert_overlap = false, per_layer_logging = false;

  // Registers the flags, the model's into *cfg (which must outlive the parse).
  void add(CLI::App& app, model::TransformerConfig* cfg);
  // After parsing, on the resolved arguments: fills the list-valued settings and refuses what is
  // not built, or does not fit the run's parallel layout, naming the flag.
  void apply(training::TrainingArgs& a) const;
};

}  // namespace megatron::cli
