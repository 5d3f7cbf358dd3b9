// Builds what generation needs from Megatron-style arguments: the tokenizer, and the model with
// the weights of a checkpoint (--load), run by the generation engine (gpt_engine.h). The
// architecture comes from the model flags (or the checkpoint's recorded arguments, see
// cli/inference_flags.h), as with Megatron's tools/run_text_generation_server.py; the
// checkpoint's tensors must match it exactly.
//
// On one process the checkpoint's tensor- and pipeline-parallel shards are merged in memory
// (checkpoint_weights.h). Launched on several ranks (mpirun / megatron launch) with
// --tensor-model-parallel-size T and --pipeline-model-parallel-size P (the checkpoint's own), every
// rank loads only its own shard (mp_rank_TT[_PPP]) and builds only its stage, in Megatron's rank
// order; the world is T x P x D ranks. Rank 0 of each model-parallel group leads, the others
// follow (distributed_engine.h); with D > 1 each data-parallel replica has its own leader.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "data/tokenizer.h"
#include "inference/gpt_engine.h"
#include "model/bert_model.h"
#include "model/transformer_config.h"

namespace megatron::inference {

struct InferenceModelOptions {
  std::string load;                   // --load
  std::optional<int64_t> ckpt_step;   // --ckpt-step
  model::TransformerConfig model;     // from the model flags; padded_vocab_size filled by load
  int64_t make_vocab_size_divisible_by = 128;
  data::TokenizerOptions tokenizer;
  // The model-parallel layout to run (the checkpoint's); used only when several ranks run.
  int tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  Device device = Device::cpu();      // where the model and its KV cache live (--device)
};

struct InferenceModel {
  std::unique_ptr<data::Tokenizer> tokenizer;
  // The model the generation loop runs on: the whole model (one process), or on a leader the
  // DistributedEngine over its model-parallel group. Null on a follower.
  std::unique_ptr<LanguageModel> model;
  int64_t iteration = 0;
  // Several ranks: this rank's stage on a follower (null on a leader), the model-parallel group,
  // and the data-parallel replica this rank belongs to.
  std::unique_ptr<GPTEngine> follower;
  std::shared_ptr<Communicator> group;
  int data_parallel_rank = 0, data_parallel_size = 1;

  bool leader() const { return model != nullptr; }
  // Follower: runs the leader's calls until it finishes. Leader: tells the followers it has
  // finished (no-op on one process). Each model-parallel rank calls one of them once.
  void follow();
  void finish();
};

// Throws megatron::Error naming the flag, file or tensor at fault. Several ranks with T x P > 1:
// collective over `world` (default: world_communicator()).
InferenceModel load_inference_model(const InferenceModelOptions& options,
                                    std::shared_ptr<Communicator> world = nullptr);

// A BERT checkpoint for masked-LM evaluation (bert_evaluate.h), loaded with the options' model
// (model_family "bert"). One process, or several launched with the parallel sizes 1: every rank
// holds the whole model (a sharded checkpoint's shards merged in memory) and is its own
// data-parallel replica. Launched with --tensor-model-parallel-size T (the checkpoint's, T x D
// ranks): every rank builds its shard of the whole model from its own mp_rank_TT files; the T
// ranks of a replica run the same micro-batches and its tensor-parallel rank 0 reports. Several
// ranks with --pipeline-model-parallel-size > 1 are refused (one process merges the stages).
struct BertInference {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<model::BertModel> model;
  int64_t iteration = 0;
  int data_parallel_rank = 0, data_parallel_size = 1;
  bool reports = true;  // this rank's scores count (tensor-parallel rank 0)
};
BertInference load_bert_model(const InferenceModelOptions& options,
                              std::shared_ptr<Communicator> world = nullptr);

// Megatron-Core checkpoints of the Transformer Engine spec keep each norm inside the next linear
// (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_bias, ...): renames those to the local
// spec's input_layernorm / pre_mlp_layernorm names the model uses.
std::map<std::string, Tensor> with_local_norm_names(std::map<std::string, Tensor> weights);

}  // namespace megatron::inference
