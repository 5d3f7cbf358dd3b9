// Megatron's flags of the inference tools (run_text_generation_server.py, tasks/main.py) for
// generate, serve and evaluate: --tensor-model-parallel-size and --pipeline-model-parallel-size
// (1: the shards are merged in memory, or the checkpoint's own sizes: the same, since this build
// runs inference on one process), --fp16 / --bf16, --no-load-optim / --no-load-rng, and the kernel
// and backend flags of megatron_compat.h.
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "cli/inference_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "inference/checkpoint_weights.h"
#include "training/checkpoint.h"
#include "training/torch_dist_checkpoint.h"

namespace megatron::cli {

namespace {

// The tensor- and pipeline-parallel sizes a checkpoint iteration folder was saved under: its
// metadata.json's when it records them (its mp_rank_TT_EEE folders of expert parallelism read
// like pipeline stages), else from its mp_rank_TT or mp_rank_TT_PPP folders ({1, 1} when there
// are none).
std::pair<int, int> saved_layout(const std::filesystem::path& folder) {
  if (std::filesystem::exists(folder / "metadata.json")) {
    const nlohmann::json meta = training::read_checkpoint_metadata(folder);
    if (meta.contains("parallel") && meta["parallel"].is_object())
      return {meta["parallel"].value("tensor_model_parallel_size", 1),
              meta["parallel"].value("pipeline_model_parallel_size", 1)};
  }
  static const std::regex name(R"(mp_rank_(\d+)(?:_(\d+))?)");
  int tp = 1, pp = 1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string n = entry.path().filename().string();
    if (!entry.is_directory(ec) || !std::regex_match(n, m, name)) continue;
    tp = std::max(tp, std::stoi(m[1].str()) + 1);
    if (m[2].matched) pp = std::max(pp, std::stoi(m[2].str()) + 1);
  }
  return {tp, pp};
}

}  // namespace

void add_inference_compat_flags(CLI::App& sub, InferenceFlags& f) {
  sub.add_option("--tensor-model-parallel-size", f.tensor_model_parallel_size,
                 "1 (a sharded checkpoint is merged in memory) or the checkpoint's own size "
                 "(under launch/mpirun: each rank loads its shard)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--pipeline-model-parallel-size", f.pipeline_model_parallel_size,
                 "1 (a sharded checkpoint is merged in memory) or the checkpoint's own size "
                 "(under launch/mpirun: each rank loads its shard)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_flag("--fp16", f.fp16, "Keep the weights in fp16 in memory (half the fp32 bytes)");
  sub.add_flag("--bf16", f.bf16, "Keep the weights in bf16 in memory (half the fp32 bytes)");
  sub.add_flag("--no-load-optim", f.no_load_optim, "Accepted: inference loads the weights only");
  sub.add_flag("--no-load-rng", f.no_load_rng, "Accepted: inference loads the weights only");
  add_compat_flags(sub, f.compat, CompatScope::Model);
}

void check_inference_compat_flags(const CLI::App& sub, const InferenceFlags& f,
                                  std::optional<int64_t> step) {
  check_compat_flags(f.compat, sub, CompatScope::Model);
  MG_REQUIRE(!(f.fp16 && f.bf16), "--fp16 and --bf16 cannot be combined: pick one");
  const int tp = f.tensor_model_parallel_size, pp = f.pipeline_model_parallel_size;
  if (tp == 1 && pp == 1) return;
  const auto where = inference::find_checkpoint_iteration(f.options.load, step);
  // Megatron-LM's torch_dist: global tensors, which any layout takes its shards of.
  if (training::is_torch_dist_checkpoint(where.folder)) return;
  const auto [saved_tp, saved_pp] = saved_layout(where.folder);
  MG_REQUIRE(tp == 1 || tp == saved_tp, "--tensor-model-parallel-size ", tp,
             " differs from the checkpoint's (", saved_tp, ", ", where.folder.string(),
             "): pass 1 (the shards are merged in memory) or ", saved_tp);
  MG_REQUIRE(pp == 1 || pp == saved_pp, "--pipeline-model-parallel-size ", pp,
             " differs from the checkpoint's (", saved_pp, ", ", where.folder.string(),
             "): pass 1 (the stages are merged in memory) or ", saved_pp);
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (world != nullptr && std::atoi(world) > 1) {
    MG_REQUIRE(tp == saved_tp && pp == saved_pp, "--tensor-model-parallel-size ", tp,
               " --pipeline-model-parallel-size ", pp, " on ", world, " ranks: the checkpoint (",
               where.folder.string(), ") is ", saved_tp, " x ", saved_pp, "; pass its sizes to run "
               "it across ranks, or run on one process (the shards are merged in memory)");
    return;
  }
  log_info("note: --tensor-model-parallel-size ", tp, " --pipeline-model-parallel-size ", pp,
           ": the checkpoint's shards are merged in memory and run on this one process");
}

}  // namespace megatron::cli
