// Megatron-LM's default checkpoint format, --ckpt-format torch_dist (Megatron-Core's
// dist_checkpointing over PyTorch's distributed checkpoint), read into any layout:
//
//   DIR/latest_checkpointed_iteration.txt
//   DIR/iter_0000500/metadata.json      {"sharded_backend": "torch_dist", "sharded_backend_version":
//                                         1, "common_backend": "torch", ...}: the format's marker
//                    common.pt          torch.save of the common state (rank 0): args, iteration,
//                                       checkpoint_version, opt_param_scheduler, ...
//                    .metadata, __R_N.distcp   the sharded state (training/torch_dist_format.h)
//
// Megatron-Core's sharded keys for GPTModel (gpt_model.py, transformer_block.py, mlp.py):
//   embedding.word_embeddings.weight    [padded vocab, h], TP chunks along rows
//   embedding.position_embeddings.weight, decoder.final_layernorm.*   replicated
//   output_layer.weight                 untied only (a tied output layer is a non-main replica of
//                                       the word embedding and is not written)
//   decoder.layers.<module>.<param>     one key per layer tensor, the global layer index as axis 0
//                                       (each layer of each pipeline stage a chunk), TP chunks of
//                                       linear_qkv (per query group: queries, key, value) and
//                                       linear_fc1 along rows, of linear_proj / linear_fc2 along
//                                       columns; SwiGLU's fc1 [gate; up] as two chunks per TP rank
//                                       (gate_r at rows r, up_r at rows T + r of 2T): assembled, a
//                                       layer's tensor is the single-rank [gate; up]. Transformer
//                                       Engine's fused norms (linear_qkv.layer_norm_weight, ...)
//                                       map as in the .pt reader (torch_checkpoint.h).
//   decoder.layers.<N>.<module>.<param>  the same per layer without the layer axis (Megatron-Core's
//                                       non_homogeneous_layers: MoE and hybrid models)
//   linear_fc1.{weight,bias}_w / _v     SwiGLU's gate and up under keys of their own (its
//                                       singleton_local_shards), each chunked over TP
//   *._extra_state/shard_*, rng_state/shard_*   bytes items (ShardedObjects): not needed here
// Assembled global tensors are our single-rank tensors (the .pt reader's name mapping); a run of
// any TP x PP layout takes its shards through the weight specs' shard rules (checkpoint_convert.h),
// the vocabulary tables re-padded to its padded vocabulary.
//
// BertModel's keys: the same layer stack under "encoder.layers.", embedding.tokentype_embeddings,
// lm_head.{dense,layer_norm}, pooler.dense, binary_head (replicated) and output_layer.bias (TP
// chunks over the vocabulary); a checkpoint with "encoder." keys is a BERT model.
// Reads stream (torch_dist_stream.h): a run's shards are read from the chunks they meet.
//
// Read: GPT models, their mixture-of-experts layers included (the experts on a global expert axis:
// torch_dist_moe.h), dense BERT models, and the optimizer state in model space
// (torch_dist_optimizer.h), and T5 models (an encoder and a decoder block: torch_dist_t5.h).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {

// True when the iteration folder holds Megatron's metadata.json with a "sharded_backend" (this
// build's own metadata.json has none).
bool is_torch_dist_checkpoint(const std::filesystem::path& iteration_dir);

// find_checkpoint for such a folder: checks the backend (torch_dist; zarr and others refused by
// name), reads common.pt (args in our shape, iteration, scheduler) and .metadata (its structure
// checked, no tensor read). `parallel` is the layout Megatron saved it with (from its args).
CheckpointOnDisk open_torch_dist_checkpoint(const std::filesystem::path& iteration_dir, bool release,
                                            std::optional<int64_t> expected_iteration);

// The model's global (single-rank) tensors under our names, those `want` accepts (all when
// empty), every value checked finite. With a `prefix` ("optimizer.state.exp_avg."), the tensors
// of the keys "<prefix><model key>" instead: a state of the optimizer in model space.
std::map<std::string, Tensor> read_torch_dist_model(
    const CheckpointOnDisk& ckpt, const std::function<bool(const std::string&)>& want = {},
    const std::string& prefix = "");

// The tensors of `params` (name -> this rank's shape) for tensor-parallel rank `rank` of this
// run's layout: global tensors cut by the weights' shard rules, vocabulary tables re-padded to
// the run's rows (new rows repeat the last, or are zero with zero_fill_rows). Names the checkpoint
// lacks are left out (the caller names them). `prefix` as for read_torch_dist_model.
std::map<std::string, Tensor> read_torch_dist_shards(const CheckpointOnDisk& ckpt,
                                                     const std::map<std::string, Shape>& params,
                                                     const CheckpointRank& rank, const std::string& prefix = "",
                                                     bool zero_fill_rows = false);

// The global shapes of the model's tensors under our names (the tied output layer left out),
// without reading them.
std::map<std::string, Shape> torch_dist_model_shapes(const CheckpointOnDisk& ckpt);

// read_torch_dist_shards of global tensors already read (`full`: our name -> global tensor).
std::map<std::string, Tensor> cut_torch_dist_shards(const CheckpointOnDisk& ckpt, std::map<std::string, Tensor> full,
                                                    const std::map<std::string, Shape>& params,
                                                    const CheckpointRank& rank, bool zero_fill_rows = false);

// merge_checkpoint for a torch_dist checkpoint: the model weights and, with with_optimizer, the
// optimizer state where the checkpoint has it in model space (torch_dist_optimizer.h).
MergedCheckpoint merge_torch_dist_checkpoint(const CheckpointOnDisk& ckpt, bool with_optimizer);

}  // namespace megatron::training
