// The pieces of pretrain_gpt (trainer.cpp holds the loop itself), as Megatron's training.py
// splits pretrain(): setup (training_setup.cpp: parallel layout, tokenizer, checkpoint lookup,
// data, model and weights, then the optimizer with its state, loss scaler and LR schedule),
// train_step and evaluate (train_step.cpp), the checkpoint save, and the metrics writer
// (metrics.h). A TrainingRun holds everything they share; the loop advances its counters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "comm/parallel_state.h"
#include "comm/timed_communicator.h"
#include "model/stage_model.h"
#include "model/pipeline_layout.h"
#include "optim/grad_buffer.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/megatron_optimizer.h"
#include "training/batch_size_schedule.h"
#include "training/checkpoint.h"
#include "training/training_data.h"
#include "training/trainer.h"

namespace megatron::training {

struct TrainingRun {
  TrainingArgs a;  // completed by setup (padded vocabulary, parameter dtype, data settings)
  std::shared_ptr<CommStats> comm_stats;  // every collective runs through the timed world
  ParallelState ps;
  Device device;  // where the model, its optimizer state and the micro-batches live (--device)
  CheckpointRank crank;
  model::PipelineLayout pipeline_layout;
  BatchSizeSchedule batch_schedule;
  int64_t mbs = 0;        // --micro-batch-size
  int64_t num_micro = 0;  // micro-batches per DP rank of the final global batch (evaluation's)
  int dp_cp = 1;          // ranks whose gradients and losses are summed (DP x CP)
  bool log_rank = false;  // Megatron's print_rank_last: the last rank logs and writes metrics

  std::optional<CheckpointOnDisk> ckpt;  // --load
  bool resume = false, load_optim = false, load_rng = false;
  int64_t start_iteration = 0, train_iters = 0;
  int64_t consumed = 0, consumed_valid = 0;  // samples taken from the train / validation splits
  uint64_t rng_seed = 0;
  uint64_t dropout_offset = 0;  // the dropout key of the next micro-batch (global numbering)

  std::unique_ptr<TrainingData> data;  // the family's splits and micro-batches
  optim::LRSchedulerConfig scheduler_config;  // from the flags (the checkpoint's once loaded)

  std::unique_ptr<model::StageModel> model;  // this rank's pipeline stage(s)
  model::ParameterList params;
  // Data x context parallel gradient buckets (null on one DP x CP rank without the distributed
  // optimizer), the optimizer, the loss scaler and the LR schedule: setup_optimizer.
  std::unique_ptr<optim::ParamAndGradBuffer> buffer;
  // Expert parallelism: the experts' weights, summed over the expert data-parallel group (then
  // `buffer` holds the other weights only); null otherwise.
  std::unique_ptr<optim::ParamAndGradBuffer> expert_buffer;
  std::unique_ptr<optim::MegatronOptimizer> optimizer;
  optim::GradScaler scaler = optim::GradScaler::constant(1.0);
  std::optional<optim::LRScheduler> scheduler;
  int64_t last_saved = -1;  // the iteration of the last checkpoint written (-1: none)

  int dp() const { return ps.dp_size(); }
  // The model family's named losses ("lm loss", ...) and how a micro-batch's loss is formed.
  const std::vector<std::string>& loss_names() const { return model->chunk(0).loss_names(); }
  model::LossReduction loss_reduction() const { return model->chunk(0).loss_reduction(); }
  // Completes the optimizer's parameter all-gathers in flight (--overlap-param-gather): every
  // reader of the parameters but the forward of the next step calls it first.
  void finish_param_sync() const {
    if (optimizer) optimizer->finish_param_sync();
  }
  void say(const std::string& line) const;  // a log line, from the last rank
  // This rank's micro-batch of `split` at sample `first` of the block: data-parallel rank
  // dp_rank's samples, then its zig-zag slice under context parallelism.
  model::Batch micro_batch(DataSplit split, int64_t first) const;
  // Sums over the data x context parallel group; the values themselves on one rank.
  std::vector<double> dp_cp_sum(std::vector<double> v) const;
};

// Validates the arguments, builds the parallel layout, tokenizer, datasets and model, finds
// --load's checkpoint and loads its weights. Collective over `world`.
TrainingRun setup_training(TrainingArgs a, std::shared_ptr<Communicator> world);
// The gradient buffer, the optimizer (plain or distributed), the loss scaler and the LR schedule,
// with their state from the checkpoint when resuming.
void setup_optimizer(TrainingRun& r);

// One iteration: this DP rank's micro-batches of the global batch at r.consumed, the
// forward/backward schedule with Megatron's loss normalisation (trainer.h), the gradient
// reduction and the optimizer step. Advances the dropout counter (not the sample count).
struct StepOutcome {
  double loss = 0;  // "lm loss": token mean of the global batch's loss (or micro-batch mean)
  std::vector<double> more_losses;  // the family's further named losses, in loss_names() order
  optim::StepResult step;
  int buckets_launched_in_backward = 0;  // with --overlap-grad-reduce
  // TensorBoard-only scalars (--moe-per-layer-logging's moe/<loss>_layer_<i>).
  std::vector<std::pair<std::string, double>> tensorboard_scalars;
  std::vector<std::vector<double>> moe_tokens_per_expert;  // MoeStepMetrics::tokens_per_expert
};
StepOutcome train_step(TrainingRun& r, int64_t iteration, int64_t micro_batches);

// Mixture of experts after a step's schedule (Megatron's finalize_model_grads expert-bias update
// and track_moe_metrics): takes every MoE layer's statistics, updates the expert biases from the
// tokens per expert summed over data x context parallel ranks, and returns the logged MoE losses
// in moe_metric_names' order (the mean over the model's MoE layers, every pipeline stage's, of
// the sum over micro-batches / micro-batches, averaged over data-parallel ranks), and with
// --moe-per-layer-logging each layer's value under Megatron's TensorBoard tag
// moe/<name>_layer_<i> (i over all layers, 0 for a dense one). Resets the layers' global_aux_loss
// counts. Collective over the DP x CP group and the pipeline group.
struct MoeStepMetrics {
  std::vector<double> logged;
  std::vector<std::pair<std::string, double>> per_layer;
  // Per layer of the model (empty for a dense one): the tokens the router sent to each expert in
  // this step, all micro-batches and data-parallel ranks (the counts the expert bias follows).
  std::vector<std::vector<double>> tokens_per_expert;
};
MoeStepMetrics moe_step_metrics(TrainingRun& r, int64_t micro_batches);
// Before a step's schedule: gives the MoE layers the DP x CP group of global_aux_loss.
void moe_step_begin(TrainingRun& r);
// The load-balancing loss of the configured type with a coefficient (load_balancing_loss,
// seq_load_balancing_loss or global_load_balancing_loss) and "z_loss" (with --moe-z-loss-coeff):
// the MoE entries of the training log line.
std::vector<std::string> moe_metric_names(const model::TransformerConfig& c);
// The MoE layers' expert biases as checkpoint tensors ("<layer>.mlp.router.expert_bias",
// float64), current; after loading them, moe_checkpoint_buffers_loaded puts them back.
model::ParameterList moe_checkpoint_buffers(TrainingRun& r);
void moe_checkpoint_buffers_loaded(TrainingRun& r);

// Megatron's evaluate(): up to --eval-iters iterations of the final global batch from sample
// `consumed_eval` of the split on (advanced), split over DP; the losses' sums and counts over
// DP x CP (each named loss's value is sum / count).
model::LossResult evaluate(TrainingRun& r, DataSplit split, int64_t& consumed_eval);
// Megatron's boxed evaluation line ("validation loss at ... | lm loss value: ...").
void print_evaluation(const TrainingRun& r, const std::string& line);
// After the loop (or instead of it with --skip-train): the validation split from `valid_from`
// and the test split from its first sample, into `sum`.
void final_evaluation(TrainingRun& r, int64_t iteration, int64_t valid_from, TrainingSummary& sum);

// Saves iteration `it` with --save (once per iteration), in --ckpt-format.
void save_checkpoint_at(TrainingRun& r, int64_t it);

}  // namespace megatron::training
