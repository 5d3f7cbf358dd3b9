// Running one global batch of micro-batches through a pipeline-parallel model (Megatron's
// forward_backward_func): the schedule of pipeline/schedules.h executed on this rank's
// model::StageModel, with activations and gradients exchanged between neighbouring pipeline
// ranks by point-to-point messages, gradients accumulated (+=) into the parameters, and the loss
// made known to every rank.
//
// Communication: every receive a schedule needs is posted as a non-blocking receive one pass
// ahead of its use (one outstanding per direction) and waited just before the pass; every send
// is non-blocking and waited at the end (completed ones are released as the schedule runs). As
// sends never block and receives are consumed in the order the neighbour sends them (MPI keeps
// the order of messages with one source and tag; activations and gradients use different tags),
// no (P, M, v) can deadlock; tests/pipeline simulates every schedule to check it. Messages carry
// the residual stream of one micro-batch, [b*s, h] fp32, or this rank's sequence shard
// [b*s/T, h] under sequence parallelism (each tensor-parallel rank exchanges with its own
// neighbours in its pipeline group).
//
// Every rank passes the same micro-batches (the whole Batch; the first stage reads the tokens
// and positions, the last the labels and loss mask, every stage the tokens' shape and
// attention_start). All micro-batches must have one shape.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/stage_model.h"
#include "pipeline/schedules.h"

namespace megatron::pipeline {

struct ForwardBackwardOptions {
  // Backward differentiates the sum over micro-batches m of scale_m * (sum over m's tokens of
  // loss * mask), as the model chunk's loss_reduction() forms it per micro-batch, where scale_m is
  // microbatch_grad_scale[m] when that holds one value per micro-batch, else grad_scale. The
  // trainer's two loss normalisations (training/trainer.h): --calculate-per-token-loss passes
  // grad_scale = loss scale / loss tokens of the global batch; Megatron's default passes
  // microbatch_grad_scale[m] = loss scale / (max(tokens of m, 1) x micro-batches x DP x CP).
  float grad_scale = 1.0f;
  std::vector<float> microbatch_grad_scale;
  // Mixture of experts: the factor of the auxiliary losses' gradients of micro-batch m
  // (Megatron's MoEAuxLossAutoScaler scale), moe_aux_grad_scale[m], or 1 when empty.
  std::vector<double> moe_aux_grad_scale;
  // Micro-batch m uses dropout offset dropout_offset + m * dropout_offset_stride: with data
  // parallelism the trainer numbers the global batch's micro-batches m * DP + dp_rank, so it
  // passes dropout_offset = base + dp_rank and dropout_offset_stride = DP.
  uint64_t dropout_offset = 0;
  uint64_t dropout_offset_stride = 1;
  bool forward_only = false;  // evaluation: no dropout, nothing kept, no backward
  // After the last backward, call StageModel::finalize_model_parallel_grads() (sequence-
  // parallel grads over TP, tied embedding grads over the embedding group), as Megatron's
  // schedules call finalize_model_grads (piecewise with grad_ready, below). The data-parallel
  // reduction commutes with it.
  bool finalize_grads = true;
  // Overlapping the data-parallel gradient reduction with the schedule (--overlap-grad-reduce;
  // Megatron's grad sync enabled only for each chunk's last micro-batch). When set (with
  // finalize_grads), grad_ready receives every parameter of this rank once, as soon as its
  // gradient is final and model-parallel finalised: during the backward of each chunk's last
  // micro-batch, group by group as ModelChunk::set_grad_ready_hook reports them, each group's
  // sequence-parallel grads first summed over TP (all TP ranks of a stage run the same schedule,
  // so this blocking sum is safe there); the tied word embedding / output-layer copy is held back
  // and reported after the schedule, once all_reduce_embedding_grads() has summed it over the
  // embedding group (the first and last stage reach their last backward at different times, so
  // that sum cannot run inside a pass). Every rank at the same pipeline position reports the
  // same parameters in the same order (the data-parallel buffer's requirement). With the
  // interleaved schedule chunk v-1 finishes first, so its reductions overlap the remaining
  // passes of the lower chunks.
  model::GradReadyHook grad_ready;
  // Called after every pass (e.g. the data-parallel buffer's progress(), so that MPI advances
  // the collectives grad_ready launched while the schedule goes on).
  std::function<void()> progress;
};

struct ForwardBackwardResult {
  // Sums over all micro-batches, computed on the last stage and broadcast over the pipeline
  // group, so every rank has them: the trainer logs loss_sum / num_tokens.
  double loss_sum = 0;
  double num_tokens = 0;
  // The family's further named losses (model::ModelChunk::loss_names() from the second on), summed
  // the same way.
  std::vector<model::LossTerm> more;
  // The most micro-batches this rank held for backward at one time (all chunks): 1F1B bounds it
  // by warmup + 1 instead of M.
  int max_in_flight = 0;
  ScheduleKind kind = ScheduleKind::NoPipelining;
};

// Megatron's get_forward_backward_func + call: no pipelining at P = 1, interleaved 1F1B with
// virtual stages, 1F1B otherwise. Collective over the model's pipeline group (and, with
// finalize_grads, its TP and embedding groups).
ForwardBackwardResult forward_backward(model::StageModel& model,
                                       const std::vector<model::Batch>& microbatches,
                                       const ForwardBackwardOptions& options = {});

// The three schedules by name (Error if the model's layout does not fit the schedule).
ForwardBackwardResult forward_backward_no_pipelining(
    model::StageModel& model, const std::vector<model::Batch>& microbatches,
    const ForwardBackwardOptions& options = {});
ForwardBackwardResult forward_backward_pipelining_without_interleaving(
    model::StageModel& model, const std::vector<model::Batch>& microbatches,
    const ForwardBackwardOptions& options = {});
ForwardBackwardResult forward_backward_pipelining_with_interleaving(
    model::StageModel& model, const std::vector<model::Batch>& microbatches,
    const ForwardBackwardOptions& options = {});

// Executes `schedule` (which must be this rank's, for the model's layout and microbatches.size()).
ForwardBackwardResult run_schedule(model::StageModel& model,
                                   const std::vector<model::Batch>& microbatches,
                                   const Schedule& schedule,
                                   const ForwardBackwardOptions& options = {});

}  // namespace megatron::pipeline
