// Megatron-LM flags that name something this build always does, or a backend it cannot use, so
// that a Megatron script runs with only its launcher line changed. Each is accepted with
// Megatron's name, type and choices; none changes what is computed here:
//   - kernels and fusions: this build has one implementation of each op (a tiled, flash-style
//     attention with the softmax in fp32, fused bias/activation/dropout, gradient accumulation
//     straight into the main gradient), so --use-flash-attn, --attention-backend,
//     --transformer-impl, --no-masked-softmax-fusion, --attention-softmax-in-fp32,
//     --no-gradient-accumulation-fusion, --cross-entropy-loss-fusion, ... select nothing;
//   - --distributed-backend: collectives run over MPI (one line says so when nccl/gloo is named);
//   - --use-cpu-initialization: weights are always initialised on the host, independent of the
//     tensor-parallel size; --use-mcore-models: Megatron-Core names and layout are this build's;
//   - --data-impl mmap|infer, --no-mmap-bin-files, --num-workers,
//     --no-create-attention-mask-in-dataloader: datasets are Megatron's mmap format, read in
//     the training process, and the causal mask is never materialised;
//   - --manual-gc*, --empty-unused-memory-level, --profile*: no garbage collector, no CUDA
//     caching allocator in use, no nsys capture range;
//   - --shape-order (the tensor layout of Ascend's fused attention).
// A value this build cannot honour (--data-impl lazy/cached: the old non-mmap file formats) is an
// error naming the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "training/megatron_arguments.h"

namespace megatron::cli {

struct CompatFlags {
  std::string distributed_backend = "nccl";         // --distributed-backend
  std::string transformer_impl = "transformer_engine";  // --transformer-impl
  std::string attention_backend = "auto";           // --attention-backend
  std::string cross_entropy_fusion_impl = "native";  // --cross-entropy-fusion-impl
  std::string shape_order = "SBH";                  // --shape-order (Ascend)
  std::string data_impl = "infer";                  // --data-impl
  bool use_flash_attn = false, use_cpu_initialization = false, use_mcore_models = false;
  bool no_masked_softmax_fusion = false, attention_softmax_in_fp32 = false;
  bool no_gradient_accumulation_fusion = false, cross_entropy_loss_fusion = false;
  bool no_bias_dropout_fusion = false, no_bias_swiglu_fusion = false, no_rope_fusion = false;
  bool no_persist_layer_norm = false, no_async_tp_allreduce = false;
  int num_workers = 2;                     // --num-workers
  bool no_create_attention_mask = false;   // --no-create-attention-mask-in-dataloader
  bool no_mmap_bin_files = false;          // --no-mmap-bin-files
  bool manual_gc = false, no_manual_gc_eval = false;
  int64_t manual_gc_interval = 0;
  int empty_unused_memory_level = 0;       // --empty-unused-memory-level 0|1|2
  bool profile = false, use_pytorch_profiler = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<int64_t> profile_ranks{0};
  int timing_log_level = 0;                // --timing-log-level 0|1|2
  std::string timing_log_option = "minmax";
};

// The two groups of flags: every command that builds a model takes the kernel and backend flags
// (Model); training and evaluation also the data-loading and runtime ones (Training).
enum class CompatScope { Model, Training };

// Adds the flags of one group to `sub`, writing into `f`.
void add_compat_flags(CLI::App& sub, CompatFlags& f, CompatScope scope);

// After parsing, for one group: the one-line notices for backends replaced here (printed once,
// on the first rank), and errors for values this build cannot honour. `sub` tells which flags
// were given.
void check_compat_flags(const CompatFlags& f, const CLI::App& sub, CompatScope scope);

// True when `flag` (e.g. "--fp16") was given on the command line of `sub`.
bool flag_given(const CLI::App& sub, const std::string& flag);

// The rest of Megatron-LM's shared parser (training/megatron_arguments.h): every flag of it that
// a command does not define itself is accepted with Megatron's number of values. After parsing,
// check_megatron_flags ignores the ones that cannot matter for the command (Runtime ones, and
// Training ones for commands that do not train) with one warning line naming them, and stops with
// an error naming the first one that would change the result (a feature this build does not
// have). Add them last, after the command's own flags.
enum class CommandKind { Training, Inference };
struct MegatronFlags {
  std::string command;
  CommandKind kind = CommandKind::Training;
  std::deque<std::vector<std::string>> values;
  struct Added {
    const training::MegatronArgument* argument;
    const CLI::Option* option;
    std::string names;  // the ones this command took from the table ("--a,--b")
  };
  std::vector<Added> added;
  // Flags the command defines itself that have no effect in this run (named in the same line).
  std::vector<std::string> ignored_too;
};
void add_megatron_flags(CLI::App& sub, MegatronFlags& f, const std::string& command, CommandKind kind);
void check_megatron_flags(const MegatronFlags& f);

}  // namespace megatron::cli
