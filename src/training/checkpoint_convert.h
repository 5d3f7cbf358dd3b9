// Resharding checkpoints: a checkpoint saved under one tensor x pipeline layout merged into the
// single-rank (TP = PP = 1) tensors and split again for another layout (`megatron checkpoint
// convert`), or merged in memory only (generation and serving read sharded checkpoints with it).
//
// Shard rules come from the weights' recorded specs (model/parameter.h WeightSpec; metadata.json
// "weights", checkpoint_weight_specs): a parameter with partition_dim d >= 0 is cut into T equal
// chunks along d, chunk r on TP rank r, each of its partition_parts blocks separately (SwiGLU's
// fc1 [gate; up]: every shard is [gate_r; up_r], as Megatron lays it out); linear_qkv's
// interleaved per-query-group layout makes its split one by whole query groups. Replicated
// parameters (norms, row-parallel biases, position embedding, BERT's heads) are taken from TP rank
// 0. Weights spanning the padded vocabulary (padded_vocab: the word table, the output layer's
// weight and bias) are re-padded to the target's padded vocabulary, Megatron's rule:
// ceil(V / (divisor * T)) * divisor * T rows for the true vocabulary size V; extra rows are cut
// off, missing rows repeat the last row (as Megatron's tools/checkpoint saver does; the Adam
// moments of new rows are 0).
// Pipeline stages: "<block>.layers.<i>." parameters carry global layer numbers; the target stage
// of layer i is i / (L / P), or with v virtual stages of L / (P v) layers, (i / (L / (P v))) % P;
// the embedding ("embedding.*") goes to the first stage, everything after the layers (the final
// norm, the output layer, a family's heads) to the last. The last stage's tied copy of the word embedding (output_layer.weight when the model ties
// them) is not in model files; its optimizer state is (equal to the embedding's): it is read and
// dropped, and written again for a PP > 1 target.
//
// T5: encoder and decoder layers are numbered from 0 each; resharded over tensor-parallel ranks
// only (one pipeline stage).
// Optimizer state (plain optimizer.safetensors or distributed-optimizer shards under any DP size)
// is read in parameter space and follows its parameter's split: fp32 main weights, Adam exp_avg /
// exp_avg_sq, SGD momentum, and the step count. The target is written with the plain
// (non-distributed) optimizer layout, which the trainer loads into either optimizer under any
// data-parallel size. With drop_optimizer the target has no optimizer state ("optimizer": null,
// as --no-save-optim): resuming from it then needs --no-load-optim (the loader says so).
//
// The target folder is written as the trainer writes checkpoints: DIR/.tmp_iter_N, files 0640,
// folders 0750, every file's size and SHA-256 in metadata.json, fsync, rename, then the tracker.
// metadata.json keeps the source's iteration, consumed samples, scheduler, grad scaler, RNG and
// args (with the new TP/PP sizes and padded vocabulary) and records "converted_from".
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/tokenizer.h"
#include "model/parameter.h"
#include "training/checkpoint.h"

namespace megatron::training {

// How a parameter's single-rank tensor is cut into tensor-parallel shards (from its spec).
struct ShardRule {
  int dim = -1;        // partition dimension, -1 replicated
  int parts = 1;       // blocks along dim, each chunked separately (SwiGLU's fc1: 2)
  bool vocab = false;  // dim 0 over the padded vocabulary (re-padded when T changes)
};
ShardRule shard_rule(const model::WeightSpec& spec);

// The specs of a checkpoint's weights: the "weights" record of metadata.json (format 3), or, for
// checkpoints that have none (format 2, Megatron-LM's .pt files, Hugging Face folders), the specs
// of the model its arguments describe (model::model_weight_specs), checked against the partition
// dims a format-2 checkpoint recorded. `metadata` is its metadata.json (null for other formats).
std::map<std::string, model::WeightSpec> checkpoint_weight_specs(const CheckpointOnDisk& ckpt,
                                                                 const nlohmann::json& metadata);
// The same from a model configuration alone (imported weights).
std::map<std::string, model::WeightSpec> config_weight_specs(const model::TransformerConfig& cfg);

// The single-rank tensor from the shards of TP ranks 0..T-1 (rank 0's for a replicated one).
Tensor merge_shards(const std::vector<Tensor>& shards, const ShardRule& rule);
// Shard `rank` of `size` of the single-rank tensor (contiguous).
Tensor split_shard(const Tensor& full, const ShardRule& rule, int rank, int size);
// `table` with `rows` rows: cut, or extended by repeating the last row (zero_fill: zeros).
Tensor repad_rows(const Tensor& table, int64_t rows, bool zero_fill);

// A checkpoint's tensors as single-rank tensors.
struct MergedCheckpoint {
  CheckpointOnDisk source;
  nlohmann::json metadata;                 // the source's metadata.json
  std::map<std::string, model::WeightSpec> specs;  // every model tensor's spec (record)
  std::map<std::string, ShardRule> rules;          // and the shard rule it implies
  std::map<std::string, Tensor> model;     // name -> single-rank tensor (parameter dtype)
  // Optimizer state in parameter space: kind ("fp32_param", "exp_avg", "exp_avg_sq",
  // "momentum_buffer") -> name -> single-rank F32 tensor. Empty without optimizer state.
  std::map<std::string, std::map<std::string, Tensor>> optimizer;
  std::string optimizer_type;  // "adam" | "sgd"; empty: none
  int64_t optimizer_step = 0;
  int64_t padded_vocab_size = 0;  // rows of the vocabulary tables
  std::vector<std::string> notes;  // what was dropped or inferred, for the user
};

// Reads every model file (and, with with_optimizer, the optimizer state) of every TP x PP rank of
// the checkpoint, sizes and SHA-256 checked, and merges them. Errors name the missing or corrupted
// file.
MergedCheckpoint merge_checkpoint(const CheckpointOnDisk& ckpt, bool with_optimizer);
// Re-pads the vocabulary tables (and their optimizer state) to `rows`.
void repad_vocabulary(MergedCheckpoint& m, int64_t rows);

struct ConvertOptions {
  std::filesystem::path load, save;
  std::optional<int64_t> ckpt_step;  // default: the tracker's iteration
  int target_tp = 1, target_pp = 1;
  // --target-expert-model-parallel-size: one folder per expert-parallel rank (mp_rank_TT_EEE),
  // each with the dense weights and its E / EP experts. The trainer also reads a checkpoint of
  // another EP size directly (resharding on load).
  int target_ep = 1;
  // --target-num-layers-per-virtual-pipeline-stage (0: none): rank r's file then holds the layers
  // of its model chunks, virtual stages c * P + r (model/stage_model.h).
  int target_layers_per_virtual_stage = 0;
  // The unpadded vocabulary size, needed when the padded size changes with T; by default the
  // tokenizer of the checkpoint's args is built (its vocabulary files must exist).
  std::optional<int64_t> true_vocab_size;
  bool drop_optimizer = false;
  // --load-format: "auto" (what the folder holds), "safetensors" (ours), "torch" (Megatron-LM's
  // model_optim_rng.pt) or "hf" (a transformers folder, training/hf_checkpoint.h); --save-format:
  // "safetensors", "torch" (training/torch_checkpoint.h), the latter for Megatron's
  // --transformer-impl (transformer_engine or local), or "hf".
  std::string load_format = "auto", save_format = "safetensors";
  std::string transformer_impl = "transformer_engine";
  // --save-format torch for a Megatron-LM run with --use-distributed-optimizer: the optimizer
  // state goes into each rank folder's distrib_optim.pt (training/torch_distrib_optim.h).
  bool use_distributed_optimizer = false;
  // The tokenizer (its files resolved by the caller): --save-format hf copies its files and takes
  // bos/eos from it; --load-format hf records it when the folder has no tokenizer files. Default:
  // the checkpoint's args.
  std::optional<data::TokenizerOptions> tokenizer;
  // --save-format hf: --target-params-dtype (default: as stored), --max-shard-size in bytes,
  // --print-checkpoint-structure (also prints what --load-format hf read).
  std::optional<DType> target_params_dtype;
  int64_t max_shard_bytes = 5'000'000'000;
  bool print_structure = false;
  // --load-format hf: Megatron's --make-vocab-size-divisible-by for the padded vocabulary.
  int64_t make_vocab_size_divisible_by = 128;
};

struct ConvertResult {
  std::filesystem::path dir;  // the written iteration folder
  int64_t iteration = 0;
  CheckpointParallel from, to;
  int64_t padded_vocab_from = 0, padded_vocab_to = 0;
  bool optimizer = false;            // optimizer state written
  std::string optimizer_note;        // why there is none, when there is none
  size_t num_tensors = 0, num_files = 0;
  std::vector<std::string> notes;
  std::string hf_model_type;  // "gpt2" | "llama" when a transformers folder was read or written
};

// Converts --load (at --ckpt-step or the tracker's iteration) into --save for the target layout.
// --save must not exist or be empty. Validates the target sizes against the model (heads, query
// groups, FFN size, padded vocabulary divisible by T; layers by P).
ConvertResult convert_checkpoint(const ConvertOptions& options);

// For generation: a checkpoint's model tensors under any layout as single-rank tensors, the
// vocabulary tables re-padded to padded_vocab_size rows (0: as saved, i.e. merged shards).
std::map<std::string, Tensor> read_single_rank_model(const CheckpointOnDisk& ckpt,
                                                     int64_t padded_vocab_size);

}  // namespace megatron::training
