// What `megatron plan` reasons about: a training run's arguments (pretrain-gpt's, resolved by the
// CLI) placed on a world of N ranks, checked as the trainer checks them, without building
// anything. From it come Megatron's arguments for the theoretical memory formula
// (megatron_memory.h), this build's own prediction (memory_model.h) and the step-time model
// (time_model.h); the layout search (layout_search.h) varies its layout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/parallel_state.h"
#include "plan/megatron_memory.h"
#include "training/trainer.h"

namespace megatron::plan {

// One way of placing the run on the world: Megatron's parallel sizes and the knobs that trade
// memory for time. world = tp * pp * cp * dp.
struct Layout {
  int tp = 1, pp = 1, cp = 1, dp = 1;
  int vp = 1;  // model chunks per pipeline rank (1: no interleaving)
  int64_t micro_batch_size = 1;
  bool sequence_parallel = false;  // only meaningful with tp > 1
  bool distributed_optimizer = false;
  // none | selective | full (full: uniform, one layer per chunk); shown by its kind's label
  model::RecomputeGranularityId recompute = model::RecomputeGranularityId::none;
  const char* recompute_label() const { return model::kRecomputeGranularityKinds[size_t(recompute)].label; }
  int world() const { return tp * pp * cp * dp; }
  // "TP2 PP2 (VP2) CP1 DP2 mbs 4 SP dist-opt recompute selective"
  std::string describe() const;
};

struct PlanInput {
  training::TrainingArgs args;  // resolved: padded vocabulary, parameter dtype, global batch
  int world_size = 1;
  Layout layout;
  int64_t global_batch_size = 0;  // the final one (a ramp-up's end)
  int64_t num_microbatches = 0;   // per DP rank and iteration, of the final global batch
  // Megatron's NUM_MICROBATCHES when the memory report is printed (the first logged iteration's;
  // the start of a batch-size ramp-up).
  int64_t first_num_microbatches = 0;
  int64_t train_iters = 0;   // iterations of the run (from --train-samples when given)
  int64_t vocab_size = 0;    // the tokenizer's, before padding
  double dataset_bytes = 0;  // the dataset indices every rank keeps (data_memory.h)
  // --swiglu without --ffn-hidden-size: Megatron-LM's width (int(8h/3 / 64) * 64) differs from
  // the 4h this build uses; set to Megatron's then.
  std::optional<int64_t> megatron_ffn_hidden_size;
  // The run keeps each layer's attention probabilities for the backward, as on the CPU; a GPU
  // recomputes them (flash-style) instead.
  bool keeps_attention_probs = true;
};

// Checks `a` for `world_size` ranks with the trainer's own checks (validate_args,
// validate_parallel_args and the model's tensor-parallel rules) and resolves what the trainer
// would: padded vocabulary (from `vocab_size`, the tokenizer's), global batch, micro-batches,
// virtual stages. megatron::Error for anything the trainer refuses. size_data: also size the
// dataset indices (reads the datasets' .idx headers).
PlanInput make_plan_input(training::TrainingArgs a, int world_size, int64_t vocab_size,
                          bool size_data = true);

// The same run with another layout (the search's candidates); the global batch is kept.
// megatron::Error when the layout does not fit the model or the batch.
PlanInput with_layout(const PlanInput& base, const Layout& layout);

// The layout the arguments describe.
Layout layout_of(const training::TrainingArgs& a, int world_size);
// The arguments of `a` with `layout` applied (parallel sizes, micro-batch, recompute, SP, ...).
training::TrainingArgs apply_layout(training::TrainingArgs a, const Layout& layout);

// The parallel groups' configuration of the layout (comm/parallel_state.h).
ParallelConfig parallel_config(const PlanInput& in);

// Megatron's args for report_theoretical_memory, as Megatron's argument processing derives them
// from the same command line (kv_channels = h / heads; the SwiGLU FFN width; query groups only
// with --group-query-attention; sequence parallelism off at TP 1; the virtual pipeline size from
// --num-layers-per-virtual-pipeline-stage; DP = world / (TP x PP x CP)).
MegatronMemoryArgs megatron_args_for(const PlanInput& in);

}  // namespace megatron::plan
