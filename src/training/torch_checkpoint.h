// Megatron-LM's own checkpoints ("--ckpt-format torch"), read and written without Python:
//
//   DIR/latest_checkpointed_iteration.txt
//   DIR/iter_0000500/mp_rank_TT[_PPP]/model_optim_rng.pt      one torch.save file per TP x PP rank
//   DIR/iter_0000500/mp_rank_TT[_PPP]_EEE/model_optim_rng.pt  under expert parallelism: per
//       TP x PP x EP rank, the dense weights and that rank's experts numbered from 0
//       (mlp.experts.local_experts.J / linear_fc1.weightJ); the optimizer entry is then
//       Megatron-Core's ChainedOptimizer list [dense, expert-parallel]. mp_rank_TT_XXX is a
//       pipeline or an expert rank as the arguments say (Megatron's get_checkpoint_name).
//
// each file a dict: "args" (argparse.Namespace), "checkpoint_version", "iteration", "model" (or
// "model0", "model1", ... one per virtual pipeline stage), "optimizer", "opt_param_scheduler",
// "rng_state", read with the restricted unpickler (core/torch_file.h: nothing is executed).
//
// Reading (find_checkpoint detects the folder; load_model_weights, load_optimizer_state,
// merge_checkpoint and read_single_rank_model read it) maps both of Megatron's name schemes onto
// ours (Megatron-Core's names, layer numbers global):
//   legacy  language_model.embedding.word_embeddings.weight  -> embedding.word_embeddings.weight
//           language_model.embedding.position_embeddings.weight
//           language_model.{encoder,transformer}.layers.N.input_layernorm.*
//                                                  -> decoder.layers.N.input_layernorm.*
//             .{self_attention,attention}.query_key_value.*   -> .self_attention.linear_qkv.*
//             .{self_attention,attention}.dense.*             -> .self_attention.linear_proj.*
//             .post_attention_layernorm.*                     -> .pre_mlp_layernorm.*
//             .mlp.dense_h_to_4h.* / .mlp.dense_4h_to_h.*     -> .mlp.linear_fc1.* / .linear_fc2.*
//           language_model.{encoder,transformer}.final_layernorm.* -> decoder.final_layernorm.*
//           language_model.output_layer.weight                -> output_layer.weight (untied)
//           word_embeddings_for_head.weight      the last stage's tied copy: dropped
//   core    the names themselves; Transformer Engine's fused norms
//           self_attention.linear_qkv.layer_norm_{weight,bias} -> input_layernorm.{weight,bias},
//           mlp.linear_fc1.layer_norm_{weight,bias}            -> pre_mlp_layernorm.{weight,bias};
//           *._extra_state skipped; output_layer.weight on the last stage of a tied model dropped.
//   t5      Megatron-Core's T5Model (one pipeline stage): the encoder's and decoder's layers and
//           final norms under their own names, the relative-bias tables, T5LMHead's
//           lm_head.output_layer.* -> output_layer.* (its output_layer.* alias checked and
//           skipped); see torch_names::t5_to_ours.
// Megatron numbers layers per pipeline stage (and model chunk); they become global numbers
// (chunk c of rank p starts at c * L / V + p * L / (P V)). QKV layouts by checkpoint_version, per
// tensor-parallel shard of n heads of d channels (fix_query_key_value_ordering): 0 stores
// [3, n, d, h], 1.0 stores [n, d, 3, h]; both become [n, 3, d, h], the layout of 2.0 and 3.0 and
// of Megatron-Core's linear_qkv (per query group: its queries, key, value), which is ours.
// The optimizer: Megatron's FP32Optimizer (torch's optimizer state_dict) or
// Float16OptimizerWithFloat16Params ({"optimizer", "grad_scaler", "fp32_from_fp16_params"}) is
// mapped onto parameters through the parameter groups (weight-decayed, then not: the model's
// parameter order split by "1-D or bias"; either group order, sizes and every shape checked):
// exp_avg, exp_avg_sq (or momentum_buffer), fp32 main params, the step. A distributed optimizer's
// state is read from distrib_optim.pt (torch_distrib_optim.h); one this build cannot lay out,
// chained optimizers or groups that do not match load the weights only, and the checkpoint's
// notes say so.
//
// Writing (checkpoint convert --save-format torch, and save_torch_checkpoint for pretrain-gpt
// --ckpt-format torch) produces Megatron-Core names in Megatron's structure, checkpoint_version
// 3.0: with --transformer-impl local the local layer spec's names, with transformer_engine (the
// default, as Megatron's) the fused norm names; an _extra_state entry (None) for every module
// that has one (extra_state_names, and output_layer on the last stage, tied or not); the optimizer
// as Megatron's wrapper for the parameter dtype (two parameter groups, weight-decayed first) in the
// form the optimizer Megatron-LM then builds loads: with transformer_engine Transformer Engine's
// FusedAdam (the step per parameter group, none per parameter: its load_state_dict refuses one),
// with local torch's AdamW (Megatron's fallback without Transformer Engine or Apex: a step tensor
// per parameter), the scheduler as OptimizerParamScheduler.state_dict, args as an
// argparse.Namespace with Megatron's argument names, rng_state as Megatron's
// [{random_rng_state, np_rng_state, torch_rng_state, cuda_rng_state, rng_tracker_states}] for
// the seed (this build's counter-based dropout state goes along as "dropout_rng_state").
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/pickle.h"
#include "core/safetensors.h"
#include "core/torch_file.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {

inline constexpr const char* kTorchCheckpointFile = "model_optim_rng.pt";

// True when the iteration folder holds Megatron-LM's files (mp_rank_00[_000]/model_optim_rng.pt)
// rather than ours (metadata.json).
bool is_torch_checkpoint(const std::filesystem::path& iteration_dir);

// find_checkpoint for such a folder: reads the first rank's file (its pickle, not its tensors)
// for the iteration, arguments, schedule, scaler and RNG, and the folder names for the layout.
// The state's args are ours (training_args_to_json's shape) from Megatron's argument names.
CheckpointOnDisk open_torch_checkpoint(const std::filesystem::path& iteration_dir, bool release,
                                       std::optional<int64_t> expected_iteration);

// One rank's file under our names: the model tensors (this rank's shards) and, when asked for and
// mappable, the optimizer state as our optimizer files hold it ("optimizer.step",
// "optimizer.state.<kind>.<name>", the last stage's tied copy of the word embedding included as
// output_layer.weight, as our trainer's optimizer has it). `notes` says what was dropped or could
// not be mapped.
struct TorchRankContents {
  SafetensorsContents model;
  std::optional<SafetensorsContents> optimizer;
  std::vector<std::string> notes;
};
// Under expert parallelism `ep_rank` picks the folder (mp_rank_TT[_PPP]_EEE); its local experts
// come out under their global numbers.
TorchRankContents read_torch_rank(const CheckpointOnDisk& ckpt, int tp_rank, int pp_rank,
                                  bool with_optimizer, int ep_rank = 0);
// What `rank` loads: its own folder's contents when the checkpoint's expert-parallel size is the
// run's, else every EP folder of its TP x PP rank merged by name (resharded: the caller ignores
// the experts it does not hold).
TorchRankContents read_torch_rank_for(const CheckpointOnDisk& ckpt, const CheckpointRank& rank,
                                      bool with_optimizer, bool* resharded);

// merge_checkpoint for a torch checkpoint.
MergedCheckpoint merge_torch_checkpoint(const CheckpointOnDisk& ckpt, bool with_optimizer);

struct TorchSaveOptions {
  // Megatron's --transformer-impl of the model that will load the files: "transformer_engine"
  // (fused norm names, _extra_state entries) or "local".
  std::string transformer_impl = "transformer_engine";
  // Megatron's --expert-model-parallel-size: one folder per TP x PP x EP rank
  // (mp_rank_TT[_PPP]_EEE), each with the dense weights and its experts numbered from 0, and
  // under EP > 1 the ChainedOptimizer's two state dicts (dense, expert-parallel).
  int expert_model_parallel_size = 1;
  // Megatron's --use-distributed-optimizer: the optimizer entry is DistributedOptimizer's state
  // dict (parameter groups and scaler) and each rank folder gets distrib_optim.pt
  // (torch_distrib_optim.h); GPT models of one model chunk without experts.
  bool distributed_optimizer = false;
};

// Writes merged tensors as a torch checkpoint for TP = tp x PP = pp (virtual stages of
// layers_per_virtual_stage layers, 0: none) into save_dir/iter_N (or release) through a temporary
// folder, then the tracker. `m` holds the single-rank tensors, padded for the target's vocabulary
// (checkpoint_convert), with m.metadata in our metadata.json shape (iteration, samples, scheduler,
// scaler, RNG, args). Returns the iteration folder.
std::filesystem::path write_torch_checkpoint(const MergedCheckpoint& m, const std::filesystem::path& save_dir,
                                             int tp, int pp, int layers_per_virtual_stage,
                                             const TorchSaveOptions& options = {});

// pretrain-gpt --ckpt-format torch: save_checkpoint's inputs and collective contract, Megatron's
// files out. Every rank saves into a staging folder of ours (save_dir/.torch_staging), world rank
// 0 then merges it and writes save_dir/iter_N/mp_rank_*/model_optim_rng.pt for this run's TP x PP
// (and virtual stages), updates the tracker and removes the staging folder. Returns the
// iteration folder.
std::filesystem::path save_torch_checkpoint(const std::filesystem::path& save_dir,
                                            const CheckpointState& state,
                                            const model::ParameterList& params,
                                            optim::MegatronOptimizer* optimizer,
                                            const CheckpointRank& rank = {},
                                            const TorchSaveOptions& options = {});

// Mapping a file's optimizer state onto its parameters (torch_checkpoint_optim.cpp).
namespace torch_detail {
// A tensor of a rank's model state dict, in Megatron's parameter order.
struct TorchParam {
  std::string ours;
  std::string name;  // in the file
  Shape shape;
  bool no_wd = false;
  bool tied_copy = false;  // the last stage's copy of the word embedding: not a model tensor here
  bool expert = false;     // an expert's weight (its optimizer under EP: the second chained one)
  bool buffer = false;     // a persistent buffer (the router's expert_bias): no optimizer state
  const pickle::Value* value = nullptr;
};
// The "optimizer" entry: one optimizer's state_dict or Megatron-Core's ChainedOptimizer list
// (dense, then expert-parallel), or why it cannot be mapped.
struct TorchOptimizers {
  struct Part {
    const pickle::Value* inner = nullptr;        // {"state", "param_groups"}
    const pickle::Value* fp32_groups = nullptr;  // Float16OptimizerWithFloat16Params' main params
    const pickle::Value* grad_scaler = nullptr;
  };
  std::vector<Part> parts;
  const pickle::Value* grad_scaler = nullptr;  // the first one's
  // Megatron's distributed optimizer: the state is in distrib_optim.pt (torch_distrib_optim.h),
  // the parts hold only the parameter groups (with the step).
  bool distributed = false;
  std::string unmappable;
};
TorchOptimizers optimizer_layout(const pickle::Value* opt, const pickle::Value* ns);
// The state as our optimizer files hold it ("optimizer.step", "optimizer.state.<kind>.<name>");
// nullopt (and a note naming `label`) when the groups do not match the parameters.
std::optional<SafetensorsContents> map_optimizer(const TorchFile& f, const TorchOptimizers& l,
                                                 const std::vector<TorchParam>& params, bool adam,
                                                 DType params_dtype, const std::string& label,
                                                 std::vector<std::string>& notes);
}  // namespace torch_detail

// Megatron's names <-> ours (torch_checkpoint_names.cpp).
namespace torch_names {
// The model family a checkpoint's parameter names show: "t5" for encoder and decoder layers
// together, "bert" for Megatron-Core's encoder layers or BERT's heads (lm_head, binary_head,
// pooler; the legacy BERT shares GPT's layer names), else "gpt".
std::string family_of(const std::vector<std::string>& megatron_names);
// Our name for a Megatron parameter name of chunk-local layer numbering, with the layer offset of
// its stage added; "" to skip (_extra_state, rotary inv_freq buffers). `tied_copy` is set for the
// last stage's copy of a tied word embedding (legacy word_embeddings_for_head.weight, or
// output_layer.weight when `tied`). `block` is the family's layer stack ("decoder" for GPT,
// "encoder" for BERT, whose legacy heads map as lm_head.bias -> output_layer.bias,
// lm_head.layernorm -> lm_head.layer_norm, language_model.pooler -> pooler, and whose earlier
// Megatron-Core heads as lm_head.output_layer.{weight,bias} -> output_layer.{weight,bias}). An
// Error names a tensor that has no place in the model and the names that are read.
std::string to_ours(const std::string& megatron_name, int layer_offset, bool tied, bool* tied_copy,
                    bool* legacy_qkv, const std::string& block = "decoder");
// Megatron-Core's name for ours, with the chunk-local layer number (layer - layer_offset).
std::string to_megatron(const std::string& our_name, int layer_offset, bool transformer_engine);
// The _extra_state entries of one layer's modules that Megatron-Core's state_dict holds: with
// Transformer Engine's layer spec its TELayerNormColumnParallelLinear, TEDotProductAttention and
// TERowParallelLinear modules; with the local spec the ColumnParallelLinear / RowParallelLinear
// ones (their get_extra_state returns None).
std::vector<std::string> extra_state_names(int local_layer, bool transformer_engine,
                                           const std::string& block = "decoder");
// T5 (Megatron-Core's T5Model; its own block in torch_checkpoint_names.cpp): our name for a
// Megatron name ("" to skip _extra_state); `alias` is set for T5Model's second registration of
// its LM head's output layer (output_layer.*, the same tensor as lm_head.output_layer.*).
// Megatron-LM's legacy T5 (language_model.*) is an Error.
std::string t5_to_ours(const std::string& megatron_name, bool* alias);
// Megatron-Core's name of ours (output_layer.* -> lm_head.output_layer.*; the writer adds the
// output_layer.* alias itself).
std::string t5_to_megatron(const std::string& our_name, bool transformer_engine);
// extra_state_names for a T5 layer: the decoder's cross-attention modules too.
std::vector<std::string> t5_extra_state_names(int layer, bool transformer_engine,
                                              const std::string& block);
// Mixture of experts under expert parallelism: Megatron numbers an EP rank's experts from 0
// (SequentialMLP's mlp.experts.local_experts.J.*, TEGroupedMLP's mlp.experts.linear_fc1.weightJ
// and .biasJ), ours globally. The expert number of such a name ("" / -1 when it is not one), and
// the name with the number moved by `delta` (local J -> global J + first expert of the rank, and
// back with a negative delta).
int expert_number(const std::string& name);
std::string shift_expert(const std::string& name, int delta);
// The _extra_state entries of one MoE layer's expert modules (local_experts: the rank's local
// expert count for SequentialMLP, 0 for grouped experts), shared expert included.
std::vector<std::string> moe_extra_state_names(int local_layer, bool transformer_engine,
                                               int local_experts, bool grouped, bool shared,
                                               const std::string& block = "decoder");
// checkpoint_version 0 / 1.0 QKV of one TP shard (heads_per_shard heads of head_dim) to ours.
Tensor fix_qkv_ordering(const Tensor& t, double checkpoint_version, int heads_per_shard,
                        int head_dim, const std::string& label);
}  // namespace torch_names

// The args mapping (torch_checkpoint_args.cpp): our training_args_to_json object as Megatron's
// flat argument names and back (fields Megatron leaves None keep our defaults).
namespace torch_args {
pickle::Value* to_namespace(pickle::Document& doc, const nlohmann::json& ours,
                            const nlohmann::json& extra);
nlohmann::json from_namespace(const pickle::Value& ns, const std::string& label);
// Checks a Megatron argument Namespace against what this build implements
// (megatron_arguments.h): a model argument it does not implement, recorded with another value
// than Megatron's default (num_experts 8, qk_l2_norm True, ...), is an Error naming it; names it
// does not know (a newer Megatron's) are returned, for one warning line.
std::vector<std::string> check_namespace(const pickle::Value& ns, const std::string& label);
// Our args from a checkpoint's "args" Namespace (null: the defaults, and a note saying so):
// from_namespace, Megatron's architecture arguments copied as they are (swiglu, normalization,
// ...), and one warning naming the arguments this build does not know. With the LR schedule of an
// opt_param_scheduler state dict, also read by the torch_dist reader's common.pt.
nlohmann::json args_of(const pickle::Value* ns, const std::string& label,
                       std::vector<std::string>& notes);
optim::LRSchedulerConfig scheduler_from_state(const pickle::Value* sd, const TrainingArgs& a,
                                              int64_t* num_steps);
}  // namespace torch_args

// Megatron's rng_state for a seed (torch_rng_state.cpp).
namespace torch_rng {
// torch.manual_seed(seed); torch.get_rng_state() (5056 bytes) and a CUDA generator's state.
std::vector<uint8_t> torch_cpu_state(uint64_t seed);
std::vector<uint8_t> torch_cuda_state(uint64_t seed);
// [{"random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state",
//   "rng_tracker_states", "dropout_rng_state"}] as Megatron's _set_random_seed(seed) leaves them on
// this rank.
pickle::Value* megatron_rng_state(pickle::Document& doc, uint64_t seed, int tp_rank, int pp_rank,
                                  uint64_t dropout_seed, uint64_t dropout_offset);
}  // namespace torch_rng

}  // namespace megatron::training
