// `megatron checkpoint <action>`: tools for checkpoint folders. `convert` reshards a checkpoint to
// another tensor x pipeline-parallel layout (training/checkpoint_convert.h), Megatron's
// tools/checkpoint/convert.py with the core loader and saver in one step, and moves checkpoints
// between this build's format and Megatron-LM's torch format (--load-format, --save-format), and to
// and from Hugging Face transformers folders (--save-format hf / --load-format hf,
// training/hf_checkpoint.h).
//
// The unpadded vocabulary size (needed when the target TP changes the padding) comes from
// --true-vocab-size, or from the tokenizer: the checkpoint's tokenizer arguments with any
// tokenizer flag given here replacing its value. A file the checkpoint names by a relative path
// (relative to the folder training ran in) that is not found from here is looked for next to
// --load and in its parent; when it is still missing, the error says which flags to pass.
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "cli/megatron_compat.h"
#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "training/checkpoint_convert.h"
#include "training/hf_checkpoint.h"

namespace megatron::cli {
namespace {

struct ConvertArgs {
  std::string load, save;
  int64_t ckpt_step = -1;
  int target_tp = 1, target_pp = 1, target_layers_per_virtual_stage = 0;
  int target_ep = 1;
  int64_t true_vocab_size = 0;
  bool no_save_optim = false;
  data::TokenizerOptions tokenizer;  // flags given here override the checkpoint's
  CLI::App* app = nullptr;
  std::string load_format = "auto", save_format = "safetensors", transformer_impl = "transformer_engine";
  bool use_distributed_optimizer = false;
  std::string target_params_dtype, max_shard_size = "5GB";
  bool print_structure = false;
  int64_t make_vocab_size_divisible_by = 128;
};

// A tokenizer file of the checkpoint's arguments, found from here: as recorded, else next to
// --load or in its parent (by its recorded relative path, then by its name).
std::string locate(const std::string& recorded, const std::filesystem::path& load) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (recorded.empty() || fs::exists(recorded, ec)) return recorded;
  const fs::path p(recorded);
  for (const fs::path& dir : {load, load.parent_path().empty() ? fs::path(".") : load.parent_path()})
    for (const fs::path& candidate : {dir / p, dir / p.filename()})
      if (p.is_relative() && fs::exists(candidate, ec)) {
        log_info("checkpoint convert: the tokenizer file ", recorded, " is ", candidate.string());
        return candidate.string();
      }
  return recorded;
}

// The unpadded vocabulary size from the tokenizer (see the file comment), or nullopt when it is
// not needed and cannot be had, or when --true-vocab-size gave it (size_given). `resolved`: the
// tokenizer options with the flags given here and the files located. Errors name the flags to pass.
std::optional<int64_t> tokenizer_vocab_size(const ConvertArgs& a, data::TokenizerOptions* resolved,
                                            bool size_given) {
  const auto found = training::find_checkpoint(a.load, a.ckpt_step >= 0 ? std::optional<int64_t>(a.ckpt_step)
                                                                        : std::nullopt);
  if (!found) return std::nullopt;  // convert_checkpoint names what is missing
  training::TrainingArgs args;
  try {
    args = training::training_args_from_json(found->state.args);
  } catch (const std::exception&) {
    return std::nullopt;  // convert_checkpoint names the malformed file
  }
  data::TokenizerOptions tok = args.tokenizer;
  const CLI::App& sub = *a.app;
  bool given = false;
  auto take = [&](const char* flag, auto& field, const auto& value) {
    if (flag_given(sub, flag)) field = value, given = true;
  };
  take("--tokenizer-type", tok.type, a.tokenizer.type);
  take("--vocab-file", tok.vocab_file, a.tokenizer.vocab_file);
  take("--merge-file", tok.merge_file, a.tokenizer.merge_file);
  take("--tokenizer-model", tok.tokenizer_model, a.tokenizer.tokenizer_model);
  take("--vocab-size", tok.vocab_size, a.tokenizer.vocab_size);
  take("--vocab-extra-ids", tok.vocab_extra_ids, a.tokenizer.vocab_extra_ids);
  if (!flag_given(sub, "--vocab-file")) tok.vocab_file = locate(tok.vocab_file, a.load);
  if (!flag_given(sub, "--merge-file")) tok.merge_file = locate(tok.merge_file, a.load);
  if (!flag_given(sub, "--tokenizer-model")) tok.tokenizer_model = locate(tok.tokenizer_model, a.load);
  *resolved = tok;
  if (size_given) return std::nullopt;
  const int src_tp = found->parallel.tensor_model_parallel_size;
  const int64_t divisor = args.make_vocab_size_divisible_by, padded = args.model.padded_vocab_size;
  int64_t vocab = 0;
  try {
    vocab = data::build_tokenizer(tok)->vocab_size();
  } catch (const Error&) {
    if (given) throw;  // the message names the flag given here
    if (a.save_format == "hf") {
      std::string files;
      for (const auto* f : {&args.tokenizer.vocab_file, &args.tokenizer.merge_file, &args.tokenizer.tokenizer_model})
        if (!f->empty()) files += (files.empty() ? "'" : ", '") + *f + "'";
      MG_THROW("--save-format hf cuts the padded vocabulary to the tokenizer's and copies its files, "
               "but the tokenizer the checkpoint was trained with (", args.tokenizer.type,
               files.empty() ? "" : ", files " + files, ") cannot be read from here, nor next to ",
               a.load, " or in its parent folder: pass its files with ",
               args.tokenizer.type == "GPT2BPETokenizer" ? "--vocab-file and --merge-file"
                                                         : "--vocab-file or --tokenizer-model",
               ", or the size alone with --true-vocab-size N (the export then has no tokenizer files)");
    }
    // Needed only when the target padding depends on the unpadded size.
    const int64_t lo = std::max<int64_t>(1, padded - divisor * src_tp + 1);
    if (padded <= 0 || data::padded_vocab_size(lo, divisor, a.target_tp) ==
                           data::padded_vocab_size(padded, divisor, a.target_tp))
      return std::nullopt;
    std::string files;
    for (const auto* f : {&args.tokenizer.vocab_file, &args.tokenizer.merge_file})
      if (!f->empty()) files += (files.empty() ? "'" : ", '") + *f + "'";
    // The tokenizer's own message would name the recorded file as a flag given here.
    MG_THROW("the padded vocabulary of the target layout (TP=", a.target_tp, ") depends on the "
             "unpadded vocabulary size, but the tokenizer the checkpoint was trained with (",
             args.tokenizer.type, files.empty() ? "" : ", files " + files,
             ", paths relative to the folder training ran in) cannot be read from here, nor next to ",
             a.load, " or in its parent folder: pass its files with --vocab-file",
             args.tokenizer.type == "GPT2BPETokenizer" ? " and --merge-file" : "",
             ", or the size with --true-vocab-size N");
  }
  MG_REQUIRE(padded <= 0 || data::padded_vocab_size(vocab, divisor, src_tp) == padded,
             given ? "the tokenizer given here" : "the checkpoint's tokenizer", " has ", vocab,
             " tokens, which pad to ", data::padded_vocab_size(vocab, divisor, src_tp),
             " rows under the checkpoint's TP=", src_tp, ", but the checkpoint has ", padded,
             " (another tokenizer?); pass the tokenizer it was trained with, or --true-vocab-size N");
  return vocab;
}

void run_convert(const ConvertArgs& a) {
  training::ConvertOptions o;
  o.load = a.load;
  o.save = a.save;
  if (a.ckpt_step >= 0) o.ckpt_step = a.ckpt_step;
  o.target_tp = a.target_tp;
  o.target_ep = a.target_ep;
  o.target_pp = a.target_pp;
  o.target_layers_per_virtual_stage = a.target_layers_per_virtual_stage;
  o.drop_optimizer = a.no_save_optim;
  o.load_format = a.load_format;
  if (a.load_format != "hf") {
    data::TokenizerOptions resolved;
    if (const auto v = tokenizer_vocab_size(a, &resolved, a.true_vocab_size > 0)) o.true_vocab_size = *v;
    if (a.true_vocab_size > 0) o.true_vocab_size = a.true_vocab_size;
    if (!resolved.type.empty()) o.tokenizer = resolved;
  } else if (flag_given(*a.app, "--tokenizer-type")) {
    o.tokenizer = a.tokenizer;  // recorded when the folder has no tokenizer files
  }
  if (a.target_params_dtype == "fp32") o.target_params_dtype = DType::F32;
  if (a.target_params_dtype == "bf16") o.target_params_dtype = DType::BF16;
  if (a.target_params_dtype == "fp16") o.target_params_dtype = DType::F16;
  o.max_shard_bytes = training::parse_shard_size(a.max_shard_size);
  o.print_structure = a.print_structure;
  o.make_vocab_size_divisible_by = a.make_vocab_size_divisible_by;
  o.save_format = a.save_format;
  o.transformer_impl = a.transformer_impl;
  o.use_distributed_optimizer = a.use_distributed_optimizer;
  const training::ConvertResult r = training::convert_checkpoint(o);
  for (const std::string& n : r.notes) log_print("note: " + n);
  if (a.save_format == "hf") {
    log_print(str("exported iteration ", r.iteration, " (", r.from.describe(), ") as a Hugging Face ",
                  model::kHfArchClasses[size_t(training::hf_arch_named(r.hf_model_type))], " folder: ",
                  r.num_tensors, " tensors, vocabulary ", r.padded_vocab_to, " (padded ",
                  r.padded_vocab_from, "), ", r.num_files, " files in ", r.dir.string()));
    return;
  }
  if (a.load_format == "hf")
    log_print(str("imported the Hugging Face ", r.hf_model_type, " model ", a.load, " (vocabulary ",
                  r.padded_vocab_from, ", padded to ", r.padded_vocab_to, ")"));
  log_print(str("converted iteration ", r.iteration, " from ", r.from.describe(), " to TP=",
                r.to.tensor_model_parallel_size, " x PP=", r.to.pipeline_model_parallel_size,
                r.to.expert_model_parallel_size > 1 ? str(" x EP=", r.to.expert_model_parallel_size) : "",
                ": ",
                r.num_tensors, " model tensors in ", r.num_files, " files, written to ",
                r.dir.string()));
  if (r.padded_vocab_from != r.padded_vocab_to)
    log_print(str("padded vocabulary: ", r.padded_vocab_from, " -> ", r.padded_vocab_to, " rows"));
  if (a.save_format == "torch")
    log_print(str("format: Megatron-LM torch checkpoint (mp_rank_*/model_optim_rng.pt, Megatron-Core "
                  "names for --transformer-impl ", a.transformer_impl, "; load it in Megatron-LM with "
                  "--ckpt-format torch)"));
  if (a.save_format == "torch_dist")
    log_print(str("format: Megatron-LM torch_dist checkpoint (.metadata, __R_N.distcp, common.pt; "
                  "Megatron-Core names for --transformer-impl ", a.transformer_impl, "; Megatron-LM "
                  "loads it under any TP x PP)"));
  if (r.optimizer && a.save_format == "torch_dist")
    log_print("optimizer state: in parameter space (the distributed optimizer's fully_reshardable "
              "format; Megatron-LM loads it with --use-distributed-optimizer "
              "--dist-ckpt-optim-fully-reshardable)");
  else if (r.optimizer && a.save_format == "torch" && a.use_distributed_optimizer)
    log_print("optimizer state: resharded (Megatron's distributed optimizer: distrib_optim.pt in each rank "
              "folder; Megatron-LM loads it with --use-distributed-optimizer)");
  else if (r.optimizer && a.save_format == "torch")
    log_print("optimizer state: resharded (Megatron's non-distributed optimizer layout)");
  else if (r.optimizer)
    log_print("optimizer state: resharded (plain optimizer layout; loads with or without "
              "--use-distributed-optimizer, under any data-parallel size)");
  else
    log_print("optimizer state: NONE (" + r.optimizer_note +
              "); resume from this checkpoint with --no-load-optim (or --finetune)");
}

CommandRegistrar reg(
    "checkpoint", "Checkpoint tools: convert (reshard to another TP/PP layout; Megatron-LM and Hugging Face formats)", 70,
    [](CLI::App& sub) {
      sub.require_subcommand(1);
      CLI::App* convert = sub.add_subcommand(
          "convert", "Reshard a checkpoint to another tensor/pipeline-parallel layout, or export / "
          "import Megatron-LM and Hugging Face formats");
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
      convert->add_option("--target-expert-model-parallel-size", a->target_ep,
                          "Expert-parallel size of the new checkpoint (one folder per "
                          "expert-parallel rank; training also loads any EP size directly)")
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
      add_tokenizer_options(*convert, a->tokenizer);
      a->app = convert;
      convert->add_option("--load-format", a->load_format,
                          "auto (what the folder holds), safetensors (this build's checkpoints), "
                          "torch (Megatron-LM's mp_rank_*/model_optim_rng.pt), torch_dist "
                          "(Megatron-LM's default format: .metadata and __R_N.distcp files) or hf (a "
                          "Hugging Face transformers folder: config.json and safetensors)")
          ->check(CLI::IsMember({"auto", "safetensors", "torch", "torch_dist", "hf"}))
          ->capture_default_str();
      convert->add_option("--save-format", a->save_format,
                          "safetensors (this build's checkpoints), torch (Megatron-LM's "
                          "model_optim_rng.pt files, for Megatron-LM's --ckpt-format torch), "
                          "torch_dist (Megatron-LM's default format: .metadata, __R_N.distcp, "
                          "common.pt; GPT models) or hf "
                          "(a Hugging Face transformers folder: GPT2LMHeadModel, LlamaForCausalLM, "
                          "MegatronBert, MixtralForCausalLM or Qwen2MoeForCausalLM)")
          ->check(CLI::IsMember({"safetensors", "torch", "torch_dist", "hf"}))
          ->capture_default_str();
      convert->add_option("--transformer-impl", a->transformer_impl,
                          "With --save-format torch or torch_dist: the --transformer-impl of the Megatron-LM run "
                          "that loads it (transformer_engine: fused norm names and _extra_state "
                          "entries; local: the local layer spec's names)")
          ->check(CLI::IsMember({"transformer_engine", "local"}))
          ->capture_default_str();
      convert->add_flag("--use-distributed-optimizer", a->use_distributed_optimizer,
                        "With --save-format torch: write the optimizer state as Megatron-LM's "
                        "distributed optimizer saves it (distrib_optim.pt in each rank folder), for a "
                        "run with --use-distributed-optimizer");
      convert->add_option("--target-params-dtype", a->target_params_dtype,
                          "With --save-format hf (or --load-format hf): the weights' dtype "
                          "(default: as stored)")
          ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
      convert->add_option("--max-shard-size", a->max_shard_size,
                          "With --save-format hf: the largest safetensors file before the weights "
                          "are split into model-0000K-of-0000N.safetensors with an index (5GB, "
                          "500MB, 2GiB or bytes)")
          ->capture_default_str();
      convert->add_flag("--print-checkpoint-structure", a->print_structure,
                        "With hf: print every tensor written (or read) with its shape and dtype");
      convert->add_option("--make-vocab-size-divisible-by", a->make_vocab_size_divisible_by,
                          "With --load-format hf: pad the vocabulary to a multiple of this times "
                          "the target tensor-parallel size (Megatron's rule)")
          ->capture_default_str();
      convert->callback([a] { run_convert(*a); });
    });

}  // namespace
}  // namespace megatron::cli
