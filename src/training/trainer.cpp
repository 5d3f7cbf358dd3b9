// The pretraining loop (trainer.h): setup, then per iteration the step, the metrics, evaluation,
// checkpoints and the exit conditions; the pieces are in training_run.h.
#include "training/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/progress.h"
#include "kernels/cuda/device_select.h"
#include "kernels/op_profile.h"
#include "training/run_log_lines.h"
#include "training/metrics_writer.h"
#include "training/training_run.h"

namespace megatron::training {

namespace {

std::atomic<bool> g_exit_signal{false};
extern "C" void on_exit_signal(int) { g_exit_signal.store(true); }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --exit-duration-in-mins and --exit-signal-handler: {time is up, a signal came}. Time and signals
// differ between ranks: MAX over the world, so all stop together.
std::pair<bool, bool> should_exit(const TrainingRun& r, Clock::time_point t_start) {
  const TrainingArgs& a = r.a;
  float stop[2] = {
      a.exit_duration_in_mins > 0 && seconds_since(t_start) / 60.0 > a.exit_duration_in_mins ? 1.f : 0.f,
      g_exit_signal.load() ? 1.f : 0.f};
  if (r.ps.world_size() > 1 && (a.exit_duration_in_mins > 0 || a.exit_signal_handler)) {
    Tensor t = Tensor::from_vector(std::vector<float>{stop[0], stop[1]}, {2});
    r.ps.world().all_reduce(t, ReduceOp::Max);
    stop[0] = t.data<float>()[0];
    stop[1] = t.data<float>()[1];
  }
  return {stop[0] > 0, stop[1] > 0};
}

// The live line beside Megatron's log lines on a terminal (core/progress.h): drawn by the rank
// that prints the log, or by a process that is the whole job.
std::string progress_line(int64_t it, int64_t total, int64_t tokens, double seconds, int64_t done,
                          double loss) {
  const double rate = seconds > 0 ? double(tokens) / seconds : 0;
  const double eta = done > 0 ? seconds / double(done) * double(total - it) : -1;
  char buf[192];
  std::snprintf(buf, sizeof buf, "iteration %lld/%lld | %.1f tokens/s | ETA %s | lm loss %.4E",
                (long long)it, (long long)total, rate, format_duration(eta).c_str(), loss);
  return buf;
}

}  // namespace

TrainingSummary pretrain(TrainingArgs a) {
  auto world = world_communicator(
      CommOptions::from_timeout_minutes(a.parallel.distributed_timeout_minutes));
  return pretrain(std::move(a), world);
}

TrainingSummary pretrain(TrainingArgs args, std::shared_ptr<Communicator> world) {
  const auto t_start = Clock::now();
  TrainingRun r = setup_training(std::move(args), std::move(world));
  const TrainingArgs& a = r.a;
  TrainingSummary sum;
  sum.start_iteration = sum.iterations = r.start_iteration;
  sum.consumed_samples = r.consumed;
  sum.world_size = r.ps.world_size();

  if (a.skip_train) {
    // Megatron's pretrain() with --skip-train: no training loop; the validation split from its
    // first sample and the test split, at the loaded iteration (0 without a checkpoint).
    r.say("skipping training (--skip-train is on) ...");
    MG_REQUIRE((r.data->has(DataSplit::valid) || r.data->has(DataSplit::test)) && a.eval_iters > 0,
               "--skip-train: nothing to evaluate: ",
               a.eval_iters == 0 ? "--eval-iters is 0"
                                 : "the validation and test splits are empty (check --split, "
                                   "--valid-data-path, --test-data-path)");
    final_evaluation(r, r.start_iteration, 0, sum);
    sum.comm_seconds = r.comm_stats->seconds;
    return sum;
  }
  setup_optimizer(r);
  if (a.exit_signal_handler) {
    std::signal(SIGTERM, on_exit_signal);
    std::signal(SIGINT, on_exit_signal);
  }
  std::vector<std::string> logged_names = r.loss_names();
  for (const std::string& n : moe_metric_names(a.model)) logged_names.push_back(n);
  MetricsWriter metrics(a, r.train_iters, r.log_rank, r.ps.world_size(), r.comm_stats,
                        logged_names);
  const int64_t consumed_at_start = r.consumed;
  const auto loop_t0 = Clock::now();
  ProgressLine progress(r.log_rank || !launched_under_mpi());
  // Megatron's report_memory after the logged iterations until the second one has run (so the
  // optimizer state is in it), on every rank of data-parallel rank 0.
  bool memory_reported = false;
  // Buckets launched by the end of the backward passes (before finish_grad_sync; under PP before
  // the tied embedding's all-reduce after the flush), the fewest over the iterations: tests check
  // the overlap.
  int launched_in_backward = -1;
  if (r.start_iteration >= r.train_iters)
    r.say(str("the checkpoint is at iteration ", r.start_iteration, ", at or past the ", r.train_iters,
              " training iterations asked for: nothing to train"));
  const int64_t per_micro = r.mbs * r.dp();  // samples of one micro-batch over the DP ranks
  // Megatron's get_num_microbatches() of the previous iteration (the schedule's at the start).
  int64_t prev_num_micro = r.batch_schedule.global_batch_size(r.consumed) / per_micro;
  bool exited_early = false;  // --exit-interval, --exit-duration-in-mins or a signal
  for (int64_t it = r.start_iteration + 1; it <= r.train_iters; ++it) {
    // This iteration's global batch (batch_size_schedule.h; checked up front by validate_against).
    const int64_t iter_gbs = r.batch_schedule.global_batch_size(r.consumed);
    const int64_t iter_micro = iter_gbs / per_micro;
    if (iter_micro != prev_num_micro) {
      // Megatron saves a checkpoint (with --save) before the number of micro-batches changes.
      r.say(str(r.batch_schedule.kind() == BatchSizeSchedule::Kind::Step ? "stepping" : "ramping up",
                " batch size from ", prev_num_micro * per_micro, " to ", iter_gbs, " at ", r.consumed,
                " consumed samples"));
      save_checkpoint_at(r, it - 1);
      prev_num_micro = iter_micro;
    }
    const auto step_t0 = Clock::now();
    const StepOutcome step = train_step(r, it, iter_micro);
    sum.iteration_seconds.push_back(seconds_since(step_t0));
    // The op profile leaves out the first iteration (allocations, product algorithm choice).
    if (it == r.start_iteration + 1 && r.train_iters > it) ops::profile::restart();
    if (r.buffer)
      launched_in_backward = launched_in_backward < 0
                                 ? step.buckets_launched_in_backward
                                 : std::min(launched_in_backward, step.buckets_launched_in_backward);
    r.consumed += iter_gbs;
    if (step.step.skipped) {
      ++sum.skipped_iterations;
      if (!a.fp16 && !std::isfinite(step.loss))
        MG_THROW("loss is ", step.loss, " at iteration ", it, " (NaN/Inf); lower --lr or check the data");
    } else {
      r.scheduler->step(iter_gbs);  // Megatron: num_microbatches x micro-batch x DP samples
    }
    sum.last_loss = step.loss;
    sum.iterations = it;
    sum.consumed_samples = r.consumed;
    sum.losses.push_back(step.loss);
    sum.more_losses.push_back(step.more_losses);
    sum.grad_norms.push_back(step.step.skipped ? std::nan("") : step.step.grad_norm);
    // Megatron logs the optimizer's learning rate after the scheduler step: the rate of the next
    // iteration (the same one after a skipped step).
    const optim::LRScheduler& sched = *r.scheduler;
    metrics.record({it, r.consumed, iter_gbs, step.loss, step.more_losses, step.step, sched.lr(),
                    sched.config().has_decoupled_lr() ? std::optional<double>(sched.decoupled_lr())
                                                      : std::nullopt,
                    r.scaler.scale(), step.tensorboard_scalars, step.moe_tokens_per_expert});
    // On the CPU the host allocator and the resident set, on a GPU the caching allocator.
    if (!memory_reported && (it % a.log_interval == 0 || it == r.train_iters)) {
      if (r.ps.dp_rank() == 0)
        log_print(r.device.is_cpu()
                      ? format_memory_report(r.ps.world_rank(), it, host_memory_stats(),
                                             resident_memory())
                      : cuda::memory_report(str("(after ", it, " iterations)"),
                                            r.ps.world_rank(), r.device));
      memory_reported = it > r.start_iteration + 1;
    }
    if (progress.due())
      progress.update(progress_line(it, r.train_iters, (r.consumed - consumed_at_start) * a.model.seq_length,
                                    seconds_since(loop_t0), it - r.start_iteration, step.loss));
    if (r.data->has(DataSplit::valid) && a.eval_iters > 0 && it % a.eval_interval == 0) {
      const model::LossResult v = evaluate(r, DataSplit::valid, r.consumed_valid);
      if (v.num_tokens > 0) {
        const NamedLosses losses = named_losses(r.loss_names(), v);
        print_evaluation(r, format_validation_line(it, losses));
        metrics.log_validation(it, r.consumed, losses);
        sum.valid_losses.push_back(losses[0].second);
      }
      metrics.restart_interval_clock();
    }
    if (a.save_interval > 0 && it % a.save_interval == 0) save_checkpoint_at(r, it);
    if (a.exit_interval > 0 && it % a.exit_interval == 0) {
      r.say(str("exiting program at iteration ", it, " (--exit-interval)"));
      exited_early = true;
      break;
    }
    const auto [time_up, signalled] = should_exit(r, t_start);
    if (time_up || signalled) {
      r.say(time_up ? str("exiting program after ", a.exit_duration_in_mins, " minutes at iteration ",
                          it, " (--exit-duration-in-mins)")
                    : str("exiting program at iteration ", it, " on a termination signal"));
      exited_early = true;
      break;
    }
  }
  progress.finish();
  r.finish_param_sync();  // no gather outlives the loop: the caller may read the parameters
  const int64_t ran = sum.iterations - r.start_iteration;
  if (ran > 0) save_checkpoint_at(r, sum.iterations);  // also after --exit-interval/-duration and a signal
  const double total = seconds_since(loop_t0);
  sum.seconds_per_iteration = ran > 0 ? total / double(ran) : 0;
  sum.tokens_per_second =
      total > 0 ? double((r.consumed - consumed_at_start) * a.model.seq_length) / total : 0;
  sum.comm_seconds = r.comm_stats->seconds;
  if (r.buffer) {
    sum.grad_buckets = int(r.buffer->layout().buckets.size());
    sum.grad_buckets_launched_in_backward = std::max(launched_in_backward, 0);
  }
  // Megatron exits without the final evaluation when the loop was stopped early.
  if (!exited_early) final_evaluation(r, sum.iterations, r.consumed_valid, sum);
  return sum;
}

}  // namespace megatron::training
