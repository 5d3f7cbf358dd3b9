// Everything one pipeline rank holds (Megatron's list of model chunks): its v model chunks
// (ModelChunk instances of the configuration's family, model_family.h; pipeline_layout.h) plus the groups the gradient finalisation needs (tensor
// parallel for the partial-sum grads, the embedding group for tied embeddings). At pipeline size
// 1 it holds one chunk, the whole model; the trainer has this one path (the schedule with P = 1 is
// "no pipelining", pipeline/schedules.h).
//
// Tied embeddings (Megatron's shared embedding): with P > 1 the output layer on the last stage
// cannot use the first stage's table, so it holds a copy, "output_layer.weight" (shape and TP
// shard of embedding.word_embeddings.weight, Parameter::shared). It is initialised equal to the
// first stage's table (same stream) and, every step, the two gradients are summed over the
// embedding group (first and last stage) before the optimizer step, so both copies stay equal.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/parallel_state.h"
#include "model/model_chunk.h"
#include "model/transformer_config.h"
#include "model/pipeline_layout.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

class StageModel {
 public:
  // The chunks of this rank's pipeline stage (pp rank of `parallel`) over its tensor- and
  // context-parallel groups (with CP > 1 every micro-batch passed to the schedules must be this
  // rank's slice_for_context_parallel; losses and gradients are then partial sums over the CP
  // group). layers_per_virtual_stage: --num-layers-per-virtual-pipeline-stage (0: none).
  // Validates the configuration (TransformerConfig::validate, the TP and the pipeline rules, the
  // family's). The chunks live on `device` (ModelOptions::device).
  // The MoE layers' experts are spread over the expert-parallel group (null or of one rank:
  // every rank holds all experts).
  StageModel(const TransformerConfig& cfg, uint64_t seed, const ParallelState& parallel,
             int layers_per_virtual_stage = 0, Device device = Device::cpu());
  // Without a ParallelState (tests, tools): pipeline rank `pp_rank` of `layout`, with explicit
  // groups; pp_group / embedding_group may be null when layout.pipeline_size == 1. The chunks
  // live on `device` (ModelOptions::device).
  StageModel(const TransformerConfig& cfg, uint64_t seed, const PipelineLayout& layout, int pp_rank,
                std::shared_ptr<Communicator> tp_group, std::shared_ptr<Communicator> pp_group,
                std::shared_ptr<Communicator> embedding_group,
                std::shared_ptr<Communicator> cp_group = nullptr, Device device = Device::cpu(),
                std::shared_ptr<Communicator> ep_group = nullptr,
                std::shared_ptr<Communicator> etp_group = nullptr);
  ~StageModel();
  StageModel(const StageModel&) = delete;
  StageModel& operator=(const StageModel&) = delete;

  const TransformerConfig& config() const { return cfg_; }
  const PipelineLayout& layout() const { return layout_; }
  int pipeline_rank() const { return pp_rank_; }
  int pipeline_size() const { return layout_.pipeline_size; }
  bool is_first_stage() const { return pp_rank_ == 0; }
  bool is_last_stage() const { return pp_rank_ == layout_.pipeline_size - 1; }
  int num_chunks() const { return int(chunks_.size()); }
  ModelChunk& chunk(int c) { return *chunks_.at(size_t(c)); }
  // The pipeline group (a group of one at P = 1) and this rank's TP group.
  Communicator& pipeline_group() const { return *pp_group_; }
  Communicator& tensor_group() const { return *tp_.group; }
  int tensor_parallel_rank() const { return tp_.rank(); }
  bool sequence_parallel() const { return tp_.sequence_parallel; }
  // Some parameters' gradients are partial sums over the TP group (Parameter::sequence_parallel).
  bool has_partial_tp_grads() const { return partial_tp_grads_; }

  // All parameters of this rank: chunk 0's, then chunk 1's, ...
  ParameterList parameters();
  // Sets the forward pre-hook of every chunk (--overlap-param-gather).
  void set_forward_pre_hook(const ForwardPreHook& hook);

  // The model-parallel half of Megatron's finalize_model_grads, after the last micro-batch's
  // backward: partial-sum parameter grads (sequence parallelism, per-head q/k norms) summed over
  // TP, then the tied word-embedding grads summed over the embedding group. Commutes with the data-parallel reduction. Collective
  // over the TP group and, on the first and last stage, the embedding group. (With
  // --overlap-grad-reduce the schedule does the same piecewise: see
  // pipeline::ForwardBackwardOptions::grad_ready.)
  void finalize_model_parallel_grads();
  void all_reduce_sequence_parallel_grads();
  void all_reduce_embedding_grads();
  // This rank's word table (first stage) or its tied copy (last stage), whose gradient needs the
  // embedding-group sum of all_reduce_embedding_grads(); null on other stages and at P = 1.
  Parameter* shared_embedding();
  // Copies the first stage's word embedding into the last stage's output_layer.weight over the
  // embedding group (after loading weights; construction already makes them equal). Collective
  // over the embedding group; no-op elsewhere and at P = 1.
  void sync_shared_embedding();

 private:
  TransformerConfig cfg_;
  PipelineLayout layout_;
  int pp_rank_ = 0;
  TensorParallel tp_;
  std::shared_ptr<Communicator> pp_group_, embedding_group_;
  bool partial_tp_grads_ = false;
  std::vector<std::unique_ptr<ModelChunk>> chunks_;
};

}  // namespace megatron::model
