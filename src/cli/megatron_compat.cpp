// Megatron-LM flags accepted for script compatibility; see megatron_compat.h.
#include "cli/megatron_compat.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"

namespace megatron::cli {

namespace {

// The rank of this process in an MPI job from the launcher's environment (MPI itself is not
// initialised while flags are checked), 0 for a plain process.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

void note(const std::string& message) {
  if (launcher_rank() == 0) log_info("note: ", message);
}

// The data-loading and runtime flags (CompatScope::Training).
void add_runtime_flags(CLI::App& sub, CompatFlags& f) {
  sub.add_option("--data-impl", f.data_impl,
                 "mmap | infer: datasets are Megatron's mmap .bin/.idx format (lazy and cached, "
                 "the old non-mmap formats, are not read)")
      ->check(CLI::IsMember({"lazy", "cached", "mmap", "infer"}))
      ->capture_default_str();
  sub.add_flag("--no-mmap-bin-files", f.no_mmap_bin_files,
               "The .bin files are always memory-mapped here (reads only what is used)");
  sub.add_option("--num-workers", f.num_workers,
                 "Data loader workers: samples are read from the mapped files in the training "
                 "process, so there are none to start")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_flag("--no-create-attention-mask-in-dataloader", f.no_create_attention_mask,
               "The causal mask is never materialised here");
  sub.add_flag("--manual-gc", f.manual_gc, "No garbage collector in this build");
  sub.add_option("--manual-gc-interval", f.manual_gc_interval, "No garbage collector in this build")
      ->capture_default_str();
  sub.add_flag("--no-manual-gc-eval", f.no_manual_gc_eval, "No garbage collector in this build");
  sub.add_option("--empty-unused-memory-level", f.empty_unused_memory_level,
                 "0 | 1 | 2: releases cached accelerator memory in Megatron-LM; nothing is cached here")
      ->check(CLI::IsMember({0, 1, 2}))
      ->capture_default_str();
  sub.add_flag("--profile", f.profile, "nsys capture range: not available in this build (a note says so)");
  sub.add_flag("--use-pytorch-profiler", f.use_pytorch_profiler, "Not available in this build");
  sub.add_option("--profile-step-start", f.profile_step_start, "With --profile")->capture_default_str();
  sub.add_option("--profile-step-end", f.profile_step_end, "With --profile")->capture_default_str();
  sub.add_option("--profile-ranks", f.profile_ranks, "With --profile");
  sub.add_option("--timing-log-level", f.timing_log_level,
                 "0 | 1 | 2: the log line always has the iteration time; no per-operation timers")
      ->check(CLI::IsMember({0, 1, 2}))
      ->capture_default_str();
  sub.add_option("--timing-log-option", f.timing_log_option, "max | minmax | all")
      ->check(CLI::IsMember({"max", "minmax", "all"}))
      ->capture_default_str();
}

}  // namespace

bool flag_given(const CLI::App& sub, const std::string& flag) {
  const CLI::Option* o = sub.get_option_no_throw(flag);
  return o != nullptr && o->count() > 0;
}

void add_compat_flags(CLI::App& sub, CompatFlags& f, CompatScope scope) {
  if (scope == CompatScope::Training) {
    add_runtime_flags(sub, f);
    return;
  }
  const std::string same = " (accepted for Megatron scripts; this build has one implementation)";
  sub.add_option("--transformer-impl", f.transformer_impl,
                 "local | transformer_engine: this build's own transformer layers either way")
      ->check(CLI::IsMember({"local", "transformer_engine"}))
      ->capture_default_str();
  sub.add_option("--attention-backend", f.attention_backend,
                 "flash | fused | unfused | local | auto: attention is always a tiled, flash-style "
                 "kernel with the softmax in fp32 here")
      ->check(CLI::IsMember({"flash", "fused", "unfused", "local", "auto"}))
      ->capture_default_str();
  sub.add_flag("--use-flash-attn", f.use_flash_attn, "Flash attention: always" + same);
  sub.add_flag("--no-masked-softmax-fusion", f.no_masked_softmax_fusion,
               "Scale, mask and softmax are one tiled pass here" + same);
  sub.add_flag("--attention-softmax-in-fp32", f.attention_softmax_in_fp32,
               "The attention softmax is always computed in fp32 here");
  sub.add_flag("--no-gradient-accumulation-fusion", f.no_gradient_accumulation_fusion,
               "Weight gradients accumulate into the main gradient directly" + same);
  sub.add_flag("--cross-entropy-loss-fusion", f.cross_entropy_loss_fusion,
               "Softmax and cross entropy are one fused op here" + same);
  sub.add_option("--cross-entropy-fusion-impl", f.cross_entropy_fusion_impl, "native | te" + same)
      ->check(CLI::IsMember({"native", "te"}))
      ->capture_default_str();
  sub.add_flag("--no-bias-dropout-fusion", f.no_bias_dropout_fusion, "Bias-dropout-add fusion" + same);
  sub.add_flag("--no-bias-swiglu-fusion", f.no_bias_swiglu_fusion, "Bias-SwiGLU fusion" + same);
  sub.add_flag("--no-rope-fusion", f.no_rope_fusion, "Rotary embedding fusion" + same);
  sub.add_flag("--no-persist-layer-norm", f.no_persist_layer_norm, "Persistent LayerNorm kernel" + same);
  sub.add_flag("--no-async-tensor-model-parallel-allreduce", f.no_async_tp_allreduce,
               "Deprecated in Megatron-LM and ignored there too");
  sub.add_flag("--use-cpu-initialization", f.use_cpu_initialization,
               "Weights are always initialised on the host, independent of the tensor-parallel size");
  sub.add_flag("--use-mcore-models", f.use_mcore_models,
               "Megatron-Core models: the names and layout of this build (deprecated in Megatron-LM)");
  sub.add_option("--distributed-backend", f.distributed_backend,
                 "nccl | gloo: collectives run over MPI in this build (a one-line note says so)")
      ->check(CLI::IsMember({"nccl", "gloo"}))
      ->capture_default_str();
  sub.add_option("--shape-order", f.shape_order,
                 "SBH | BSH | BSND | BNSD: tensor layout of Ascend's fused attention; no effect here")
      ->check(CLI::IsMember({"SBH", "BSH", "BSND", "BNSD"}))
      ->capture_default_str();
}

static void add_table_flags(CLI::App& sub, MegatronFlags& f);

void add_megatron_flags(CLI::App& sub, MegatronFlags& f, const std::string& command, CommandKind kind) {
  f.command = command;
  f.kind = kind;
  // Added when the command is the one run (CLI11 calls this before parsing its arguments):
  // creating some 600 options for every command would double the binary's start-up time.
  sub.preparse_callback([&sub, &f](size_t) { add_table_flags(sub, f); });
}

static void add_table_flags(CLI::App& sub, MegatronFlags& f) {
  using training::ArgValues;
  for (const training::MegatronArgument& a : training::megatron_arguments()) {
    // The names of the entry that the command does not define itself.
    std::string names;
    std::string all = a.flag;
    if (a.values == ArgValues::Toggle) all += ",--no-" + all.substr(2);
    for (size_t start = 0; start < all.size();) {
      const size_t comma = std::min(all.find(',', start), all.size());
      const std::string name = all.substr(start, comma - start);
      if (sub.get_option_no_throw(name) == nullptr) names += (names.empty() ? "" : ",") + name;
      start = comma + 1;
    }
    if (names.empty()) continue;
    const std::string help = "Megatron-LM flag (" +
                             std::string(a.effect == training::ArgEffect::Runtime ? "no effect here"
                                         : a.effect == training::ArgEffect::Training
                                             ? "training only"
                                             : "changes the model") +
                             ")";
    std::vector<std::string>& sink = f.values.emplace_back();
    CLI::Option* o = nullptr;
    switch (a.values) {
      case ArgValues::None:
      case ArgValues::Toggle: o = sub.add_flag(names, help); break;
      case ArgValues::One: o = sub.add_option(names, sink, help)->expected(1); break;
      case ArgValues::Many: o = sub.add_option(names, sink, help)->expected(0, -1); break;
    }
    o->group("");  // hidden from --help (README's "Coming from Megatron-LM" describes them)
    f.added.push_back({&a, o, names});
  }
}

void check_megatron_flags(const MegatronFlags& f) {
  std::string ignored;
  size_t i = 0;
  for (const auto& [a, o, names] : f.added) {
    const std::vector<std::string>& values = f.values[i++];
    if (o->count() == 0) continue;
    const std::string used = names.substr(0, names.find(','));
    const bool harmless =
        a->effect == training::ArgEffect::Runtime ||
        (a->effect == training::ArgEffect::Training && f.kind == CommandKind::Inference) ||
        (std::string(a->flag) == "--spec" && values == std::vector<std::string>{"local"});
    if (harmless) {
      ignored += (ignored.empty() ? "" : ", ") + used;
      continue;
    }
    MG_THROW(used, " (a Megatron-LM flag) ",
             a->effect == training::ArgEffect::Model ? "changes what the model computes"
                                                     : "changes the training run",
             " in a way this build does not implement, so ", f.command,
             " cannot honour it; remove it (README: Coming from Megatron-LM lists what is "
             "supported)");
  }
  for (const std::string& flag : f.ignored_too) ignored += (ignored.empty() ? "" : ", ") + flag;
  if (!ignored.empty() && launcher_rank() == 0)
    log_warn("ignoring Megatron-LM flags that have no effect on ", f.command, " here: ", ignored);
}

void check_compat_flags(const CompatFlags& f, const CLI::App& sub, CompatScope scope) {
  if (scope == CompatScope::Training) {
    if (flag_given(sub, "--data-impl"))
    MG_REQUIRE(f.data_impl == "mmap" || f.data_impl == "infer", "--data-impl ", f.data_impl,
               " names Megatron-LM's old non-mmap dataset format, which this build does not read; "
               "use --data-impl mmap (files written by preprocess-data, or Megatron's "
               "--dataset-impl mmap)");
    if (flag_given(sub, "--profile") || flag_given(sub, "--use-pytorch-profiler"))
      note("--profile: this build has no profiler capture range; the run goes on without one");
    return;
  }
  if (flag_given(sub, "--distributed-backend"))
    note("--distributed-backend " + f.distributed_backend +
         ": this build runs its collectives over MPI (Open MPI's shared memory and network "
         "transports) instead");
  if (flag_given(sub, "--transformer-impl") && f.transformer_impl == "transformer_engine")
    note("--transformer-impl transformer_engine: this build uses its own fused kernels (the "
         "local implementation; same model, same checkpoint names)");
}

}  // namespace megatron::cli
