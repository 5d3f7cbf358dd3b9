// Training checkpoints (Megatron's folder layout, safetensors instead of pickles):
//
//   DIR/latest_checkpointed_iteration.txt     decimal iteration (or "release"), written last
//   DIR/iter_0000500/metadata.json            format_version, iteration, consumed samples, grad
//                                             scaler, LR scheduler, RNG, the parallel layout, all
//                                             arguments, and the size + SHA-256 of every tensor file
//   DIR/iter_0000500/mp_rank_TT/model.safetensors      this tensor-parallel rank's parameters (the
//                                                      shards under the single-rank names, layout in
//                                                      model/tensor_parallel.h), parameter dtype
//   DIR/iter_0000500/mp_rank_TT/optimizer.safetensors  optimizer state (absent with --no-save-optim):
//       optimizer.step                              I64 [] successful optimizer steps
//       optimizer.state.fp32_param.<param>          F32 main weights (bf16/fp16 models only)
//       optimizer.state.exp_avg.<param>             F32 Adam first moment
//       optimizer.state.exp_avg_sq.<param>          F32 Adam second moment
//       optimizer.state.momentum_buffer.<param>     F32 SGD momentum (instead of the two above)
//   DIR/iter_0000500/mp_rank_TT/distrib_optim_dp_RRR.safetensors   with --use-distributed-optimizer,
//       instead of optimizer.safetensors: data-parallel rank RRR's shard, written by that rank:
//       optimizer.step, optimizer.shard.{fp32_param, exp_avg, exp_avg_sq | momentum_buffer}, each
//       F32 [shard elements], and in the header's __metadata__ "pieces": a JSON array of
//       [param name, first element in the parameter, length, offset in the shard] saying which
//       elements of which parameter the shard holds (optim/grad_buffer.h), so the state can be
//       read back under any data-parallel size, or by the non-distributed optimizer, and back.
// TT is the tensor-parallel rank (2 digits; mp_rank_TT_PPP when pipeline-parallel, PPP the
// pipeline rank: its stage's parameters, under their global names "decoder.layers.<i>...", all of
// its model chunks with virtual stages). The last stage's copy of the tied word embedding
// (output_layer.weight, Parameter::shared) is not in its model file: it is the first stage's
// embedding.word_embeddings.weight, copied over after loading; its optimizer state is saved (it
// equals the first stage's). Model and plain optimizer files are written by data-parallel rank 0
// of each model-parallel rank;
// metadata.json and the tracker by world rank 0 once every rank's files are complete.
// Expert parallelism (--expert-model-parallel-size EP > 1): one folder per TP x PP x EP rank,
// mp_rank_TT_EEE or mp_rank_TT_PPP_EEE (Megatron's names), each holding the dense weights and
// that rank's E / EP experts under their global numbers
// (decoder.layers.<l>.mlp.experts.local_experts.<e>.*, WeightSpec::expert), written with the plain
// optimizer's file by expert data-parallel rank 0 of that rank; each rank's distributed-optimizer
// shard (its pieces of the dense and of the expert buffer) goes into its own folder as
// distrib_optim_dp_RRR, RRR its data-parallel rank. A run under another EP size (or none:
// generate, serve, convert) reads every tensor by name from the folder that holds it.
//
// metadata.json, abridged:
//   {"format_version": 3, "iteration": 500, "consumed_train_samples": 4000,
//    "consumed_valid_samples": 640,
//    "grad_scaler": {"scale": 65536.0, "growth_tracker": 12, "hysteresis_tracker": 2},
//    "opt_param_scheduler": {"max_lr": 3e-4, "min_lr": 3e-5, "lr_warmup_steps": 800,
//                            "lr_decay_steps": 8000, "lr_decay_style": "cosine", "num_steps": 4000,
//                            ...},                      (steps in samples, as Megatron's)
//    "rng_state": {"generator": "philox4x32-10", "seed": 1234, "dropout_offset": 1000},
//    "optimizer": {"type": "adam", "distributed": false},   (null with --no-save-optim)
//    "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
//                 "virtual_pipeline_model_parallel_size": 1,
//                 "data_parallel_size": 2},          (absent in single-rank checkpoints of old;
//                 "expert_model_parallel_size" too when EP > 1)
//    "weights": {"<param>": {"init": "normal", "weight_decay": true, "partition_dim": 0,
//                "partition_parts": 1, "padded_vocab": true, "sequence_parallel": false,
//                "shared": false, "grad_reduction": "data_parallel"}, ...},
//                                                      (model/parameter.h WeightSpec; format 3)
//    "args": {...every TrainingArgs field...},
//    "files": {"mp_rank_00/model.safetensors": {"bytes": 123, "sha256": "..."}, ...}}
//
// Saving writes the iteration folder under a temporary name (.tmp_iter_...), fsyncs, renames it,
// and then replaces the tracker (temp file + rename). Files 0640, folders 0750. Loading verifies
// every listed file's size and SHA-256 before parsing it; every problem is a megatron::Error
// naming the file. A checkpoint loads under any data- and expert-parallel size; the tensor- and
// pipeline-parallel sizes and virtual stages must be the checkpoint's (check_checkpoint_layout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/parallel_state.h"
#include "model/parameter.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/megatron_optimizer.h"
#include "training/trainer.h"

namespace megatron::training {

// 3: metadata.json records every weight's spec ("weights"); 2 (read too) recorded only the
// partition dims (the rest follows from the model the args describe).
inline constexpr int kCheckpointFormatVersion = 3;

// Counter-based dropout RNG: masks are a pure function of (seed, offset); the trainer advances
// the offset by one per micro-batch.
struct RngState {
  uint64_t seed = 0;
  uint64_t dropout_offset = 0;
};

// Everything but the tensors.
struct CheckpointState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0;
  optim::GradScalerState grad_scaler;
  bool grad_scaler_dynamic = false;  // only a dynamic scaler's state is restored
  optim::LRSchedulerConfig scheduler;
  int64_t scheduler_num_steps = 0;
  std::optional<RngState> rng;  // nullopt: not saved (--no-save-rng)
  std::string optimizer_type;   // "adam" | "sgd"; empty: no optimizer file (--no-save-optim)
  nlohmann::json args = nlohmann::json::object();  // training_args_to_json
};

// The argument set as JSON (nested like TrainingArgs: "model", "tokenizer", "data", "optimizer",
// ...) and back; fields absent from the JSON keep their defaults.
nlohmann::json training_args_to_json(const TrainingArgs& args);
TrainingArgs training_args_from_json(const nlohmann::json& j);

// This rank's place in a checkpoint. The default is a single rank.
struct CheckpointRank {
  Communicator* world = nullptr;  // null or a group of one: single rank, no collectives
  int tp_size = 1, tp_rank = 0, pp_size = 1, pp_rank = 0, dp_size = 1, dp_rank = 0;
  int vp_size = 1;  // model chunks (virtual stages) per pipeline rank; 1 without interleaving
  // Expert parallelism: this rank's expert-parallel rank and its rank in the expert data-parallel
  // group (the replicas of its experts; with ep_size 1 it is dp_rank). Expert data-parallel rank 0
  // of each TP x PP x EP rank writes that rank's folder, as Megatron's
  // get_data_modulo_expert_parallel_rank() == 0.
  int ep_size = 1, ep_rank = 0, edp_rank = 0;
  // --expert-tensor-parallel-size other than TP (it must divide TP): the experts of TP rank t are
  // expert-tensor shard t % etp_size. 0: TP. edp_rank is then this rank's place among the ranks
  // of the same TP x PP x EP rank (the replicas of its folder), the first of which writes it.
  int etp_size = 0;
  static CheckpointRank from(const ParallelState& ps);
  bool multi() const { return world != nullptr && world->size() > 1; }
  // "mp_rank_TT", with PP > 1 "mp_rank_TT_PPP", with EP > 1 "_EEE" appended (Megatron's
  // get_checkpoint_name).
  std::string rank_dir() const;
};
// The folder of one rank's files (CheckpointRank::rank_dir): tp_rank TT, pipeline rank PPP when
// pp_size > 1, expert-parallel rank EEE when ep_size > 1.
std::string checkpoint_rank_dir(int tp_rank, int pp_size, int pp_rank, int ep_size, int ep_rank);


// Saves a checkpoint; returns the iteration folder. A null `optimizer`: no optimizer files.
// Collective over rank.world: every rank calls it; each writes its own files (see above).
// `params` are this rank's (shards under TP).
std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir,
                                      const CheckpointState& state,
                                      const model::ParameterList& params,
                                      optim::MegatronOptimizer* optimizer,
                                      const CheckpointRank& rank = {});

// The parallel layout a checkpoint was saved under.
struct CheckpointParallel {
  int tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1;
  int virtual_pipeline_model_parallel_size = 1;  // model chunks per pipeline rank
  bool distributed_optimizer = false;  // the optimizer state is in distrib_optim_dp_*.safetensors
  // Expert parallelism: one folder per TP x PP x EP rank (mp_rank_TT[_PPP]_EEE), each holding the
  // dense weights and its own experts, E / EP of them, under their global expert numbers.
  int expert_model_parallel_size = 1;
  // --expert-tensor-parallel-size when it differs from TP (0: TP): the experts in TP rank t's
  // folder are then expert-tensor shard t % ETP (ETP divides TP), the same in every folder of
  // that shard; metadata.json records "expert_tensor_parallel_size".
  int expert_tensor_parallel_size = 0;
  int etp() const { return expert_tensor_parallel_size > 0 ? expert_tensor_parallel_size : tensor_model_parallel_size; }
  std::string describe() const;        // "TP=2 x PP=1 x DP=2 (distributed optimizer)"
};

// Everything metadata.json holds, written by one function and read by one (every writer: the
// trainer's save, `checkpoint convert`, the .pt merge, the Hugging Face import). Reading accepts
// every format version this build reads (2 and kCheckpointFormatVersion) and gives the current
// struct: older layouts are migrated there and nowhere else.
struct CheckpointMetadata {
  CheckpointState state;
  nlohmann::json optimizer = nullptr;  // the optimizer files' description; null: none saved
  std::optional<CheckpointParallel> parallel;  // absent: old single-rank ones, fresh imports
  nlohmann::json weights = nullptr;    // name -> weight spec (model/weight_spec.h); null: not recorded
  nlohmann::json files = nullptr;      // relative path -> {"bytes", "sha256"}; null: none written
  nlohmann::json converted_from = nullptr;  // `checkpoint convert`'s record of its source
};
nlohmann::ordered_json checkpoint_metadata_to_json(const CheckpointMetadata& m);
// Errors name `label` (the file) and the key.
CheckpointMetadata checkpoint_metadata_from_json(const nlohmann::json& j, const std::string& label);

// A checkpoint found on disk, its metadata parsed (tensor files are read on demand).
struct CheckpointOnDisk {
  std::filesystem::path dir;  // DIR/iter_NNNNNNN or DIR/release
  bool release = false;       // tracker said "release": weights only, iteration 0
  CheckpointState state;
  CheckpointParallel parallel;
  nlohmann::json files;  // relative path -> {"bytes", "sha256"}
  // "safetensors" (this layout) or "torch": Megatron-LM's mp_rank_*/model_optim_rng.pt files
  // (training/torch_checkpoint.h), read by the same functions.
  std::string format = "safetensors";
  std::vector<std::string> notes;  // what reading will leave out (torch: unmappable optimizer state)
};

// The layout every writer and reader shares (our safetensors checkpoints, conversion, Megatron's
// .pt files): DIR/iter_0000100/ (or DIR/release/) and the tracker DIR/latest_checkpointed_iteration.txt.
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
std::string iteration_dir_name(int64_t iteration);  // "iter_0000100"

// The iteration folder --load and --ckpt-step name, for every reader (training, conversion,
// generate/serve/evaluate): DIR/iter_NNNNNNN of --ckpt-step, else the one the tracker names
// ("release": DIR/release, iteration 0). nullopt when nothing is there to load: DIR does not
// exist, or holds neither a tracker nor iteration folders. Iteration folders without a tracker,
// a tracker that is not a file or holds no iteration, and a named folder that is missing (or only
// moved aside by an interrupted re-save) are errors saying how to proceed.
struct CheckpointLocation {
  std::filesystem::path dir;
  int64_t iteration = 0;
  bool release = false;
};
std::optional<CheckpointLocation> locate_checkpoint(const std::filesystem::path& load_dir,
                                                    std::optional<int64_t> ckpt_step);

// Resolves --load / --ckpt-step (locate_checkpoint) and reads the folder's metadata. nullopt when
// nothing is there to load (Megatron starts from scratch then). Bad metadata is an error naming
// the path.
std::optional<CheckpointOnDisk> find_checkpoint(const std::filesystem::path& load_dir,
                                                std::optional<int64_t> ckpt_step);

// The checkpoint's tensor- and pipeline-parallel sizes and virtual stages must be this run's (the
// data-parallel size may differ): otherwise an error naming both layouts and the
// `megatron checkpoint convert` command that reshards it.
void check_checkpoint_layout(const CheckpointOnDisk& ckpt, const CheckpointRank& rank);

// Reads this rank's model.safetensors (size and SHA-256 verified) into the parameters: every
// parameter must be present with its shape; the dtype must match unless allow_dtype_conversion.
// Parameter::shared replicas (the last pipeline stage's tied output_layer.weight) are neither
// saved nor loaded: the caller copies them from their owner (StageModel::sync_shared_embedding).
void load_model_weights(const CheckpointOnDisk& ckpt, const model::ParameterList& params,
                        bool allow_dtype_conversion, const CheckpointRank& rank = {});

// Megatron's check_checkpoint_args: the flags that fix the model's tensors (--num-layers,
// --hidden-size, --num-attention-heads, --ffn-hidden-size, --kv-channels, --num-query-groups,
// --max-position-embeddings, the padded vocabulary) must equal the checkpoint's; for a resume
// (not --finetune) also --seq-length and the parameter dtype (--fp16/--bf16). Then every setting
// that changes the function (check_model_function_args). A mismatch is an error naming the flag,
// the checkpoint's value, the given value and metadata.json. `args` has its derived fields
// (padded_vocab_size, params_dtype) filled in (checkpoint_args_check.cpp).
void check_checkpoint_args(const CheckpointOnDisk& ckpt, const TrainingArgs& args, bool finetune);

// Every setting of model::model_settings() beyond the shape ones (activation, norm and its
// epsilon, position embedding, rotary settings, window, biases, untied output, q/k norm) must be
// equal in the checkpoint's recorded arguments and this run's; a setting a checkpoint did not
// record means its default then. A difference is an error naming the flag, both values and
// metadata.json, unless args.override_checkpoint_model_args (--override-checkpoint-model-args: a
// warning per difference, this run's value kept).
void check_model_function_args(const CheckpointOnDisk& ckpt, const TrainingArgs& args);

// Megatron's OptimizerParamScheduler.load_state_dict rule for each schedule value (LR, min LR,
// warmup, decay steps and style, weight-decay range and style): --override-opt_param-scheduler
// takes the command line's value, --use-checkpoint-opt_param-scheduler the checkpoint's, and
// otherwise they must be equal (error naming the flag). A negative from_args.max_lr means --lr was
// not given.
optim::LRSchedulerConfig resolve_scheduler_config(const optim::LRSchedulerConfig& from_args,
                                                  const CheckpointOnDisk& ckpt, bool override_args,
                                                  bool use_checkpoint);

// True when the checkpoint has optimizer state.
bool has_optimizer_state(const CheckpointOnDisk& ckpt);
// Reads the optimizer state of this rank's tensor-parallel rank (optimizer.safetensors or the
// distributed optimizer's shards, whichever the checkpoint has, under any data-parallel size)
// into the optimizer: fp32 main weights, moments, step count; the model weights stay as
// load_model_weights set them. Errors suggest --no-load-optim.
void load_optimizer_state(const CheckpointOnDisk& ckpt, optim::MegatronOptimizer& optimizer,
                          const CheckpointRank& rank = {});

// SHA-256 of a file, lowercase hex.
std::string sha256_file(const std::filesystem::path& file);

// An iteration folder's metadata.json, parsed after checking it against metadata.json.sha256;
// errors name the file. For every reader of checkpoints (generate, serve, convert, the trainer).
nlohmann::json read_checkpoint_metadata(const std::filesystem::path& iteration_dir);

// Weights are refused when not finite: an error naming the tensor, the element and `where` (the
// file), then `remedy` (by default: load an earlier iteration). Integer tensors pass. Every reader
// of weights calls it: our tensor files, Megatron-LM's .pt files, Hugging Face folders.
void check_finite_tensor(const Tensor& t, const std::string& name, const std::string& where,
                         const std::string& remedy = "");
void check_finite_tensors(const std::map<std::string, Tensor>& tensors, const std::string& where);

}  // namespace megatron::training
