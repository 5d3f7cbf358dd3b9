// `megatron checkpoint <action>`: tools for checkpoint folders. `convert` reshards a checkpoint to
// another tensor x pipeline-parallel layout (training/checkpoint_convert.h), Megatron's
// tools/checkpoint/convert.py with the core loader and saver in one step, and moves checkpoints
// between this build's format and Megatron-LM's torch format (--load-format, --save-format). Exports to other
// formats (--to hf-gpt2) will be further actions of this command.
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "training/checkpoint_convert.h"

namespace megatron::cli {
namespace {

struct ConvertArgs {
  std::string load, save;
  int64_t ckpt_step = -1;
  int target_tp = 1, target_pp = 1, target_layers_per_virtual_stage = 0;
  int64_t true_vocab_size = 0;
  bool no_save_optim = false;
  std::string load_format = "auto", save_format = "safetensors", transformer_impl = "transformer_engine";
};

void run_convert(const ConvertArgs& a) {
  training::ConvertOptions o;
  o.load = a.load;
  o.save = a.save;
  if (a.ckpt_step >= 0) o.ckpt_step = a.ckpt_step;
  o.target_tp = a.target_tp;
  o.target_pp = a.target_pp;
  o.target_layers_per_virtual_stage = a.target_layers_per_virtual_stage;
  if (a.true_vocab_size > 0) o.true_vocab_size = a.true_vocab_size;
  o.drop_optimizer = a.no_save_optim;
  o.load_format = a.load_format;
  o.save_format = a.save_format;
  o.transformer_impl = a.transformer_impl;
  const training::ConvertResult r = training::convert_checkpoint(o);
  for (const std::string& n : r.notes) log_print("note: " + n);
  log_print(str("converted iteration ", r.iteration, " from ", r.from.describe(), " to TP=",
                r.to.tensor_model_parallel_size, " x PP=", r.to.pipeline_model_parallel_size, ": ",
                r.num_tensors, " model tensors in ", r.num_files, " files, written to ",
                r.dir.string()));
  if (r.padded_vocab_from != r.padded_vocab_to)
    log_print(str("padded vocabulary: ", r.padded_vocab_from, " -> ", r.padded_vocab_to, " rows"));
  if (a.save_format == "torch")
    log_print(str("format: Megatron-LM torch checkpoint (mp_rank_*/model_optim_rng.pt, Megatron-Core "
                  "names for --transformer-impl ", a.transformer_impl, "; load it in Megatron-LM with "
                  "--ckpt-format torch)"));
  if (r.optimizer && a.save_format == "torch")
    log_print("optimizer state: resharded (Megatron's non-distributed optimizer layout)");
  else if (r.optimizer)
    log_print("optimizer state: resharded (plain optimizer layout; loads with or without "
              "--use-distributed-optimizer, under any data-parallel size)");
  else
    log_print("optimizer state: NONE (" + r.optimizer_note +
              "); resume from this checkpoint with --no-load-optim (or --finetune)");
}

CommandRegistrar reg(
    "checkpoint", "Checkpoint tools: convert (reshard to another TP/PP layout)", 70,
    [](CLI::App& sub) {
      sub.require_subcommand(1);
      CLI::App* convert = sub.add_subcommand(
          "convert", "Reshard a checkpoint to another tensor/pipeline-parallel layout");
      auto a = std::make_shared<ConvertArgs>();
      convert->add_option("--load", a->load, "Checkpoint folder to read")->required();
      convert->add_option("--save", a->save, "New (or empty) folder to write the converted checkpoint to")
          ->required();
      convert->add_option("--ckpt-step", a->ckpt_step,
                          "Iteration to convert (default: latest_checkpointed_iteration.txt)");
      convert->add_option("--target-tensor-parallel-size", a->target_tp,
                          "Tensor-parallel size of the new checkpoint")
          ->capture_default_str();
      convert->add_option("--target-pipeline-parallel-size", a->target_pp,
                          "Pipeline-parallel size of the new checkpoint")
          ->capture_default_str();
      convert->add_option("--target-num-layers-per-virtual-pipeline-stage",
                          a->target_layers_per_virtual_stage,
                          "Interleaved pipeline: layers per virtual stage of the new checkpoint "
                          "(default: none)");
      convert->add_option("--true-vocab-size", a->true_vocab_size,
                          "Unpadded vocabulary size (default: from the checkpoint's tokenizer "
                          "arguments), needed to re-pad the embedding when TP changes");
      convert->add_flag("--no-save-optim", a->no_save_optim,
                        "Leave the optimizer state out (resume then needs --no-load-optim)");
      convert->add_option("--load-format", a->load_format,
                          "auto (what the folder holds), safetensors (this build's checkpoints) or "
                          "torch (Megatron-LM's mp_rank_*/model_optim_rng.pt)")
          ->check(CLI::IsMember({"auto", "safetensors", "torch"}))
          ->capture_default_str();
      convert->add_option("--save-format", a->save_format,
                          "safetensors (this build's checkpoints) or torch (Megatron-LM's "
                          "model_optim_rng.pt files, for Megatron-LM's --ckpt-format torch)")
          ->check(CLI::IsMember({"safetensors", "torch"}))
          ->capture_default_str();
      convert->add_option("--transformer-impl", a->transformer_impl,
                          "With --save-format torch: the --transformer-impl of the Megatron-LM run "
                          "that loads it (transformer_engine: fused norm names and _extra_state "
                          "entries; local: the local layer spec's names)")
          ->check(CLI::IsMember({"transformer_engine", "local"}))
          ->capture_default_str();
      convert->callback([a] { run_convert(*a); });
    });

}  // namespace
}  // namespace megatron::cli
