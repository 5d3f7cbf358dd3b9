// Pipeline-parallel GPT: the part of the model one pipeline rank holds (Megatron's model chunks).
//
// PipelineLayout is Megatron's split of the L decoder layers over P pipeline ranks, each holding
// v model chunks (virtual stages, --num-layers-per-virtual-pipeline-stage; v = 1 without it):
// chunk c of rank r is virtual stage c*P + r and holds the L/(P*v) consecutive layers starting at
// (c*P + r) * L/(P*v). Virtual stage 0 (rank 0, chunk 0) also holds the embedding; the last one
// (rank P-1, chunk v-1) the final LayerNorm and the output layer with the loss.
//
// GPTChunk is one model chunk, built from the same layers as GPTModel and initialised exactly as
// the single-rank model (each parameter drawn whole from its single-rank stream, this rank's TP
// slice kept), under the single-rank names (global layer numbers). Activations between chunks
// are the residual stream [b*s, h] fp32 (batch-first rows, gpt_model.h), or this rank's sequence
// shard [b*s/T, h] under sequence parallelism, which is what Megatron sends between stages.
// A chunk holds several micro-batches in flight (keyed by micro-batch id): forward moves what
// backward needs out of the layers into a per-micro-batch stash, backward moves it back.
//
// Tied embeddings (Megatron's shared embedding): with P > 1 the output layer on the last stage
// cannot use the first stage's table, so it holds a copy, "output_layer.weight" (shape and TP
// shard of embedding.word_embeddings.weight, Parameter::shared). It is initialised equal to the
// first stage's table (same stream) and, every step, the two gradients are summed over the
// embedding group (first and last stage) before the optimizer step, so both copies stay equal.
//
// GPTStageModel is everything one rank holds: its v chunks plus the groups the gradient
// finalisation needs (tensor parallel for sequence-parallel grads, the embedding group).
// The schedules that run micro-batches through it are in pipeline/schedules.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/parallel_state.h"
#include "model/gpt_model.h"
#include "model/layers.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

struct PipelineLayout {
  int num_layers = 1;     // --num-layers (the whole model)
  int pipeline_size = 1;  // --pipeline-model-parallel-size
  int num_chunks = 1;     // virtual stages per rank (1: no interleaving)

  // Validates Megatron's rules with errors naming the flags: L % P == 0; with
  // layers_per_virtual_stage > 0 (--num-layers-per-virtual-pipeline-stage): P > 1 and
  // (L / P) % layers_per_virtual_stage == 0, giving v = L / P / layers_per_virtual_stage.
  static PipelineLayout make(int num_layers, int pipeline_size, int layers_per_virtual_stage = 0);
  // Error unless the fields describe an even split (for layouts built by hand).
  void validate() const;

  int num_virtual_stages() const { return pipeline_size * num_chunks; }
  int layers_per_chunk() const { return num_layers / num_virtual_stages(); }
  int virtual_stage(int pp_rank, int chunk) const { return chunk * pipeline_size + pp_rank; }
  int first_layer(int pp_rank, int chunk) const {
    return virtual_stage(pp_rank, chunk) * layers_per_chunk();
  }
  bool has_embedding(int pp_rank, int chunk) const { return virtual_stage(pp_rank, chunk) == 0; }
  bool has_output(int pp_rank, int chunk) const {
    return virtual_stage(pp_rank, chunk) == num_virtual_stages() - 1;
  }
};

// Per-call settings of a chunk's forward.
struct ChunkForward {
  bool training = true;         // dropout on, keep activations for backward
  float grad_scale = 1.0f;      // last chunk: backward differentiates grad_scale * sum(loss * mask)
  uint64_t dropout_offset = 0;  // as GPTModel::forward_backward: < 2^40, one per micro-batch
};

class GPTChunk {
 public:
  // Chunk `chunk` of pipeline rank `pp_rank` under `layout`, over the tensor-parallel group `tp`
  // (and the context-parallel group `cp`: micro-batches are then this rank's slices, see
  // slice_for_context_parallel). cfg.num_layers is the whole model's and must equal
  // layout.num_layers.
  GPTChunk(const GPTConfig& cfg, uint64_t seed, const TensorParallel& tp,
           const PipelineLayout& layout, int pp_rank, int chunk,
           const ContextParallel& cp = ContextParallel::none());
  ~GPTChunk();
  GPTChunk(const GPTChunk&) = delete;
  GPTChunk& operator=(const GPTChunk&) = delete;

  // This chunk's parameters in single-rank order: embedding.{word,position}_embeddings (first
  // chunk), its decoder layers, decoder.final_layernorm and output_layer.weight (last chunk, when
  // it does not also hold the embedding).
  ParameterList parameters();

  bool has_embedding() const;  // first virtual stage: takes tokens
  bool has_output() const;     // last virtual stage: returns the loss
  int first_layer() const;
  int num_layers() const;      // layers held here
  // Rows of the activation this chunk receives and sends for a micro-batch of b x s tokens:
  // b*s, or b*s/T under sequence parallelism.
  int64_t activation_rows(int64_t batch, int64_t seq) const;

  // Forward of micro-batch `microbatch` (an id, unique among those in flight). The first chunk
  // reads in.tokens / in.position_ids (x is ignored); the others take x, the previous chunk's
  // output [activation_rows, h]. Every chunk reads in.tokens' shape and in.attention_start; the
  // last reads in.labels / in.loss_mask. Returns the output activation, or, on the last chunk, an
  // undefined tensor with *loss filled (loss must then be non-null). With opt.training the
  // micro-batch stays in flight until backward; the last chunk already differentiates the loss
  // head here (the gradient of the fused vocab-parallel cross entropy, the output weight's grad
  // included) and keeps only the gradient of its decoder output.
  Tensor forward(int64_t microbatch, const GPTInputs& in, const Tensor& x, const ChunkForward& opt,
                 LossResult* loss = nullptr);
  // Backward of an in-flight micro-batch: dy is the gradient of this chunk's output (ignored on
  // the last chunk, whose output is the loss). Gradients are ADDED into Parameter::grad. Returns
  // the gradient of the input activation (undefined on the first chunk).
  Tensor backward(int64_t microbatch, const Tensor& dy);

  int in_flight() const;  // micro-batches forwarded but not yet backwarded
  // The forward pre-hook (gpt_model.h): called in forward() with each module's parameters
  // before the module runs (embedding, each layer, final LayerNorm and output_layer.weight).
  void set_forward_pre_hook(ForwardPreHook hook);

  // As GPTModel::set_grad_ready_hook, for the backward passes run while it is set (the schedule
  // sets it for the chunk's last micro-batch only): each group of parameters is reported as soon
  // as that backward has added its last contribution, in reverse model order: the final LayerNorm
  // and output_layer.weight (last chunk; their gradients were finished by the forward, which
  // differentiates the loss head), then each layer from the last to the first, then the
  // embedding (first chunk). Every parameter of the chunk is reported once per backward; an
  // empty function (the default) disables it.
  using GradReadyHook = GPTModel::GradReadyHook;
  void set_grad_ready_hook(GradReadyHook hook);

  // The word-embedding table (first chunk) or its copy (last chunk); null otherwise.
  Parameter* word_embedding();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

class GPTStageModel {
 public:
  // The chunks of this rank's pipeline stage (pp rank of `parallel`) over its tensor- and
  // context-parallel groups (with CP > 1 every micro-batch passed to the schedules must be this
  // rank's slice_for_context_parallel; losses and gradients are then partial sums over the CP
  // group). layers_per_virtual_stage: --num-layers-per-virtual-pipeline-stage (0: none).
  // Validates the configuration (GPTConfig::validate, the TP and the pipeline rules).
  GPTStageModel(const GPTConfig& cfg, uint64_t seed, const ParallelState& parallel,
                int layers_per_virtual_stage = 0);
  // Without a ParallelState (tests, tools): pipeline rank `pp_rank` of `layout`, with explicit
  // groups; pp_group / embedding_group may be null when layout.pipeline_size == 1.
  GPTStageModel(const GPTConfig& cfg, uint64_t seed, const PipelineLayout& layout, int pp_rank,
                std::shared_ptr<Communicator> tp_group, std::shared_ptr<Communicator> pp_group,
                std::shared_ptr<Communicator> embedding_group,
                std::shared_ptr<Communicator> cp_group = nullptr);
  ~GPTStageModel();
  GPTStageModel(const GPTStageModel&) = delete;
  GPTStageModel& operator=(const GPTStageModel&) = delete;

  const GPTConfig& config() const { return cfg_; }
  const PipelineLayout& layout() const { return layout_; }
  int pipeline_rank() const { return pp_rank_; }
  int pipeline_size() const { return layout_.pipeline_size; }
  bool is_first_stage() const { return pp_rank_ == 0; }
  bool is_last_stage() const { return pp_rank_ == layout_.pipeline_size - 1; }
  int num_chunks() const { return int(chunks_.size()); }
  GPTChunk& chunk(int c) { return *chunks_.at(size_t(c)); }
  // The pipeline group (a group of one at P = 1) and this rank's TP group.
  Communicator& pipeline_group() const { return *pp_group_; }
  Communicator& tensor_group() const { return *tp_.group; }
  int tensor_parallel_rank() const { return tp_.rank(); }
  bool sequence_parallel() const { return tp_.sequence_parallel; }

  // All parameters of this rank: chunk 0's, then chunk 1's, ...
  ParameterList parameters();
  // Sets the forward pre-hook of every chunk (--overlap-param-gather).
  void set_forward_pre_hook(const ForwardPreHook& hook);

  // The model-parallel half of Megatron's finalize_model_grads, after the last micro-batch's
  // backward: sequence-parallel parameter grads summed over TP, then the tied word-embedding
  // grads summed over the embedding group. Commutes with the data-parallel reduction. Collective
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
  GPTConfig cfg_;
  PipelineLayout layout_;
  int pp_rank_ = 0;
  TensorParallel tp_;
  std::shared_ptr<Communicator> pp_group_, embedding_group_;
  std::vector<std::unique_ptr<GPTChunk>> chunks_;
};

}  // namespace megatron::model
