// The pretraining loop behind `megatron pretrain-gpt`: global batch -> micro-batches (gradient
// accumulation) -> loss-scaled backward -> gradient reduction -> unscale/inf check -> clip ->
// optimizer -> LR step -> log / evaluate / save / exit. Dropout masks are keyed by a counter that
// advances by one per micro-batch of the global batch.
// Loss normalisation, as Megatron-LM (pretrain_gpt.py loss_func returns the micro-batch's loss sum
// and loss-token count; pipeline_parallel/schedules.py forward_step; distributed_data_parallel.py
// gradient_scaling_factor; finalize_model_grads):
// - default: the gradient is that of mean over DP x CP ranks of mean over the rank's micro-batches
//   of (loss sum / max(loss tokens, 1)) of the micro-batch's part on that rank, i.e. each
//   micro-batch's backward is scaled by loss_scale / (max(its tokens, 1) x micro-batches x DP x
//   CP) and gradients are summed over DP x CP. Micro-batches with fewer loss tokens
//   (--eod-mask-loss, padding) weigh each of their tokens more. Under CP each rank divides by the
//   loss tokens of its own slice (Megatron-LM's loss_func counts the local mask), so a CP run
//   equals the single-rank one only when the slices hold as many loss tokens.
// - --calculate-per-token-loss: one token mean over the global batch (loss sum over every
//   micro-batch and DP x CP rank / their loss tokens): scale loss_scale / global loss tokens.
// The logged "lm loss" (and TrainingSummary::losses) is the token mean of the global batch in both
// modes, and the validation / test loss the token mean over the evaluated batches: Megatron's
// train_step and evaluate() sum the [loss sum, tokens] pairs over micro-batches and DP x CP ranks.
//
// Parallelism (mpirun -np N, N = TP x PP x CP x DP; Megatron's rank order, comm/parallel_state.h):
// - data parallel: DP rank r takes micro-batch m's samples [consumed + (m*DP + r)*mbs, +mbs) (the
//   single-rank run's global micro-batch m*DP + r, with the same dropout key), the loss scales
//   above are applied in backward, and gradients are SUMMED over DP in buckets
//   (optim/grad_buffer.h; --overlap-grad-reduce starts a bucket as soon as backward has finished
//   its parameters), so every rank gets exactly the single-rank gradient up to summation order;
//   --use-distributed-optimizer shards the optimizer over DP (optim/distributed_optimizer.h);
// - tensor (+ sequence) parallel: every rank of a TP group trains on the same micro-batches
//   (model/gpt_model.h); sequence-parallel gradients are summed over TP after backward; the grad
//   norm and the inf check are reduced over the model-parallel group (the world with the
//   distributed optimizer) with Megatron's TP-duplicate rule, so every rank skips together;
// - pipeline parallel (--pipeline-model-parallel-size, optionally interleaved with
//   --num-layers-per-virtual-pipeline-stage): each rank builds its stage (model/stage_model.h) and
//   every iteration runs Megatron's schedule over the DP rank's micro-batches
//   (pipeline/forward_backward.h: 1F1B or interleaved 1F1B, tied-embedding and sequence-parallel
//   grads finalised there), then the DP reduction as above. The last stage computes the loss and
//   the schedule broadcasts it over the pipeline group; the grad norm is reduced over TP x PP with
//   the last stage's copy of the tied word embedding left out (counted once, on the first stage).
//   With --overlap-grad-reduce the schedule hands each model chunk's parameters to the buckets
//   during the backward of the chunk's last micro-batch (Megatron's grad sync on the last
//   micro-batch only), so their DP reduction overlaps the remaining passes; the tied word
//   embedding's bucket follows after the flush, once it was summed over the embedding group.
//   Evaluation runs the forward-only schedule.
// - context parallel (model/context_parallel.h): the CP ranks of a DP rank load the same
//   micro-batches and each keeps its zig-zag slice of every sequence (chunks r and 2CP-1-r of
//   2CP); logged loss sums and token counts are summed over DP x CP, and so are gradients (the buffer
//   and the distributed optimizer work over the DP x CP group, as Megatron's
//   data_parallel_group_with_cp). With PP the stages take the CP group and each schedule's
//   micro-batches are the CP slices.
// The last rank (last pipeline stage: it has the loss) prints the log lines and writes the JSONL
// metrics and TensorBoard files (as Megatron's print_rank_last); checkpoints are written per rank
// (checkpoint.h), or with --ckpt-format torch as Megatron-LM's model_optim_rng.pt files
// (torch_checkpoint.h).
// The global batch may change between iterations (--rampup-batch-size, --step-batch-size-schedule;
// training/batch_size_schedule.h): each iteration takes its batch from the consumed-sample count,
// the LR schedule steps by it, and a checkpoint is saved (with --save) before the micro-batch
// count changes, as Megatron does. --skip-train evaluates and returns before the loop.
// --load resumes exactly: the checkpoint restores iteration, consumed samples (the sampler goes on
// with the next sample), weights, optimizer, loss scaler, LR schedule and the dropout counter, so a
// resumed run reproduces the uninterrupted one bit for bit. --save also writes a checkpoint when
// training stops early (--exit-interval, --exit-duration-in-mins, SIGTERM/SIGINT with
// --exit-signal-handler, which finish the current iteration first; all ranks stop together).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/data_builder.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "training/tensorboard.h"

namespace megatron::training {

// Parallel layout and data-parallel knobs (Megatron's flags). The model-side switch
// --sequence-parallel is model::TransformerConfig::sequence_parallel.
struct ParallelArgs {
  int tensor_model_parallel_size = 1;      // --tensor-model-parallel-size
  int pipeline_model_parallel_size = 1;    // --pipeline-model-parallel-size
  int num_layers_per_virtual_pipeline_stage = 0;  // --num-layers-per-virtual-pipeline-stage (0: none)
  int context_parallel_size = 1;           // --context-parallel-size
  bool use_distributed_optimizer = false;  // --use-distributed-optimizer
  bool overlap_grad_reduce = false;        // --overlap-grad-reduce
  bool overlap_param_gather = false;       // --overlap-param-gather (all-gather during forward)
  int64_t ddp_bucket_size = 0;             // --ddp-bucket-size in elements (0: max(40M, 1M x DP))
  double distributed_timeout_minutes = 10; // --distributed-timeout-minutes
  // Mixture of experts (the experts' own mesh, Megatron's parallel folding):
  int expert_model_parallel_size = 1;      // --expert-model-parallel-size
  int expert_tensor_parallel_size = 0;     // --expert-tensor-parallel-size (0: the TP size)
};

struct TrainingArgs {
  model::TransformerConfig model;
  ParallelArgs parallel;
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
  // --device: cuda | cpu | "" (a GPU when one is present; kernels/cuda/device_select.h)
  std::string device;
  // precision
  bool fp16 = false, bf16 = false;
  double loss_scale = 0;  // 0: dynamic for fp16
  double initial_loss_scale = 4294967296.0, min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000, hysteresis = 2;
  // logging / eval / exit
  int64_t log_interval = 100;
  bool log_throughput = false;
  bool moe_per_layer_logging = false;  // --moe-per-layer-logging: TensorBoard moe/<loss>_layer_<i>
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
  bool override_checkpoint_model_args = false;      // --override-checkpoint-model-args
  bool exit_on_missing_checkpoint = false;          // --exit-on-missing-checkpoint

  // Megatron flags parsed by `pretrain-gpt` with Megatron's names, types and defaults. Not in the
  // checkpoint's argument JSON (the LR schedule's decoupled bounds are, with the scheduler).
  // --rampup-batch-size START INCR SAMPLES: the global batch grows from START by INCR every
  // SAMPLES / ((global - START) / INCR) consumed samples (empty: no ramp-up); needs
  // --train-samples. --step-batch-size-schedule "TOKENS:BATCH ...": the batch from each token
  // threshold on. Both: batch_size_schedule.h (Megatron's num_microbatches_calculator.py).
  std::vector<int64_t> rampup_batch_size;
  std::string step_batch_size_schedule;  // ("": none)
  // --decoupled-lr / --decoupled-min-lr: the embedding's and output layer's own peak / minimum LR
  // (optim/lr_scheduler.h; the minimum defaults to --min-lr).
  std::optional<double> decoupled_lr, decoupled_min_lr;
  // --grad-reduce-in-bf16 (with --bf16): each rank's gradients are rounded to bf16 before the
  // data-parallel reduction and the sum is rounded to bf16 (optim/grad_buffer.h); without --bf16
  // it has no effect, as in Megatron-LM.
  bool grad_reduce_in_bf16 = false;
  bool mock_data = false;            // --mock-data: Megatron's synthetic GPT dataset, no files
  // pretrain-bert's masked dataset (data/bert_dataset.h): --mask-prob, --short-seq-prob.
  double mask_prob = 0.15, short_seq_prob = 0.1;
  // --calculate-per-token-loss: the gradient of one token mean over the global batch (every
  // micro-batch and DP x CP rank); off (Megatron's default), each micro-batch's loss is divided by
  // its own loss-token count, then by the number of micro-batches, and averaged over DP x CP.
  // See the top of this file.
  bool calculate_per_token_loss = false;
  // --skip-train: no training loop; evaluate the validation split (from its first sample) and the
  // test split at the loaded iteration, as Megatron; an error when there is nothing to evaluate.
  bool skip_train = false;
  int64_t train_epochs = 0;          // --train-epochs: not Megatron's; refused (validate_args)
  // --ckpt-format: left out (""), this build's own resharding format (safetensors per rank,
  // checkpoint.h); torch_dist, given by name, Megatron-Core's torch_dist folder (each rank its own
  // items, torch_dist_write.h); torch, Megatron-LM's files (iter_N/mp_rank_TT[_PPP]/
  // model_optim_rng.pt and latest_checkpointed_iteration.txt, torch_checkpoint.h). The last two
  // with the names of --transformer-impl (transformer_impl below). --load reads every format
  // whatever --ckpt-format says.
  std::string ckpt_format;
  std::string transformer_impl = "transformer_engine";  // --transformer-impl (names in .pt files)
};

// Checks cross-flag constraints; throws megatron::Error naming the flags
// (training_args_check.cpp, with validate_parallel_args below).
void validate_args(const TrainingArgs& a);

struct TrainingSummary {
  int64_t start_iteration = 0;  // iteration loaded with --load (0 from scratch or --finetune)
  int64_t iterations = 0, consumed_samples = 0, skipped_iterations = 0;  // totals at the end
  double last_loss = 0;           // per-token loss of the last iteration
  double tokens_per_second = 0;   // over the whole run
  double seconds_per_iteration = 0;
  std::vector<double> losses;      // per-token loss of every iteration run (same on all ranks)
  // The family's further losses of every iteration run (BERT: {sop loss}; empty for GPT).
  std::vector<std::vector<double>> more_losses;
  std::vector<double> iteration_seconds;  // wall time of every iteration's step on this rank
  std::vector<double> grad_norms;  // grad norm of every iteration run (NaN when skipped)
  std::vector<double> valid_losses;  // per-token validation loss of every evaluation (all ranks)
  double test_loss = std::nan("");   // --skip-train: the test split's per-token loss
  double comm_seconds = 0;         // this rank's time blocked in collectives (timed_communicator.h)
  // Data-parallel gradient buckets of this rank (0 without a buffer), and the fewest of them,
  // over the iterations run, whose reduction --overlap-grad-reduce had launched by the end of the
  // backward passes (under PP: before the tied embedding's all-reduce after the flush).
  int grad_buckets = 0;
  int grad_buckets_launched_in_backward = 0;
  int world_size = 1;
};

// Checks the parallel layout against the world size: TP x PP x CP must divide it, the global
// batch must split into micro-batches x DP, the layers must split over the pipeline (and
// virtual) stages, the interleaved schedule needs a number of micro-batches divisible by PP, and
// the model must split over TP; with CP > 1 the sequence length must be divisible by 2 x CP (and,
// under sequence parallelism, seq-length / CP by TP). Throws megatron::Error naming the flags.
void validate_parallel_args(const TrainingArgs& a, int world_size);

// Runs the whole training of the model family args.model.model_family says (builds tokenizer,
// data, model, optimizer) over the MPI world (a world of one without a launcher): pretrain-gpt
// and pretrain-bert. Log lines go to stdout (last rank only).
TrainingSummary pretrain(TrainingArgs args);
// The same over `world` (tests run a single-rank reference inside an MPI job with a self
// communicator). Collective: every rank of `world` calls it with the same arguments.
TrainingSummary pretrain(TrainingArgs args, std::shared_ptr<Communicator> world);

}  // namespace megatron::training
