// The single-rank pretraining loop behind `megatron pretrain-gpt`: global batch -> micro-batches
// (gradient accumulation) -> loss-scaled backward -> unscale/inf check -> clip -> optimizer ->
// LR step -> log / evaluate / exit. The per-iteration loss is Megatron's per-token average
// (sum of loss over all micro-batches / number of loss tokens); each micro-batch's backward is
// scaled by loss_scale / (tokens_in_global_batch), so the accumulated gradient is the gradient of
// that average. Dropout masks are keyed by a counter that advances by one per micro-batch.
// --load resumes exactly: the checkpoint restores iteration, consumed samples (the sampler goes on
// with the next sample), weights, optimizer, loss scaler, LR schedule and the dropout counter, so a
// resumed run reproduces the uninterrupted one bit for bit. --save also writes a checkpoint when
// training stops early (--exit-interval, --exit-duration-in-mins, SIGTERM/SIGINT with
// --exit-signal-handler, which finish the current iteration first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/data_builder.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "training/tensorboard.h"

namespace megatron::training {

struct TrainingArgs {
  model::GPTConfig model;
  int64_t make_vocab_size_divisible_by = 128;
  data::TokenizerOptions tokenizer;
  data::GPTDataConfig data;
  // batch / schedule
  int64_t micro_batch_size = 0, global_batch_size = 0;  // 0: global = micro
  int64_t train_iters = 0, train_samples = 0;           // exactly one > 0
  double lr = -1, min_lr = 0.0, lr_warmup_init = 0.0, lr_warmup_fraction = -1;
  std::string lr_decay_style = "linear";
  int64_t lr_decay_iters = 0, lr_decay_samples = 0, lr_warmup_iters = 0, lr_warmup_samples = 0;
  std::string lr_wsd_decay_style = "exponential";
  int64_t lr_wsd_decay_iters = 0, lr_wsd_decay_samples = 0;
  double weight_decay = 0.01, start_weight_decay = -1, end_weight_decay = -1;
  std::string weight_decay_incr_style = "constant";
  optim::OptimizerConfig optimizer;
  std::string optimizer_name = "adam";
  uint64_t seed = 1234;
  // precision
  bool fp16 = false, bf16 = false;
  double loss_scale = 0;  // 0: dynamic for fp16
  double initial_loss_scale = 4294967296.0, min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000, hysteresis = 2;
  // logging / eval / exit
  int64_t log_interval = 100;
  bool log_throughput = false;
  int64_t eval_interval = 1000, eval_iters = 100;
  int64_t exit_interval = 0;
  double exit_duration_in_mins = 0;
  bool exit_signal_handler = false;
  std::string metrics_jsonl;  // --log-metrics-jsonl: one JSON object per logged interval
  TensorBoardOptions tensorboard;  // --tensorboard-dir and its companions
  // checkpoints (see checkpoint.h for the layout)
  std::string save;  // --save
  int64_t save_interval = 0;
  bool no_save_optim = false, no_save_rng = false;  // --no-save-optim, --no-save-rng
  std::string load;          // --load: resume from (or finetune) the checkpoint there
  int64_t ckpt_step = -1;    // --ckpt-step: load this iteration instead of the tracker's
  bool finetune = false;     // --finetune: weights only; iteration, samples, optimizer reset
  bool no_load_optim = false, no_load_rng = false;  // --no-load-optim, --no-load-rng
  bool override_opt_param_scheduler = false;        // --override-opt_param-scheduler
  bool use_checkpoint_opt_param_scheduler = false;  // --use-checkpoint-opt_param-scheduler
  bool exit_on_missing_checkpoint = false;          // --exit-on-missing-checkpoint
};

// Checks cross-flag constraints; throws megatron::Error naming the flags.
void validate_args(const TrainingArgs& a);

struct TrainingSummary {
  int64_t start_iteration = 0;  // iteration loaded with --load (0 from scratch or --finetune)
  int64_t iterations = 0, consumed_samples = 0, skipped_iterations = 0;  // totals at the end
  double last_loss = 0;           // per-token loss of the last iteration
  double tokens_per_second = 0;   // over the whole run
  double seconds_per_iteration = 0;
};

// Runs the whole training (builds tokenizer, data, model, optimizer). Log lines go to stdout.
TrainingSummary pretrain_gpt(TrainingArgs args);

}  // namespace megatron::training
