// The training loop's metrics (Megatron's training_log): every iteration's scalars to
// TensorBoard, and every --log-interval iterations (and at the last) the interval's log line
// (metrics.h format_log_line), one JSON object per interval with --log-metrics-jsonl, and the
// interval's timing to TensorBoard. With MoE the JSON object also carries each MoE layer's share
// of the interval's routed tokens per expert ("moe_expert_token_shares": {"<layer>": [E]}, layers
// 0-based). Only the last rank writes (print_rank_last); the others keep no files open. Skipped
// iterations (inf/NaN gradients) count in the interval's time and samples but not in its mean
// loss; the logged grad norm is the last advanced iteration's.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/timed_communicator.h"
#include "optim/megatron_optimizer.h"
#include "training/metrics.h"
#include "training/tensorboard.h"
#include "training/trainer.h"

namespace megatron::training {

struct IterationRecord {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;   // after the iteration
  int64_t global_batch_size = 0;  // this iteration's
  double loss = 0;                // "lm loss": token mean of the global batch (or micro-batch mean)
  std::vector<double> more_losses;  // the family's further losses (loss_names() from the second)
  optim::StepResult step;
  double learning_rate = 0;                       // after the scheduler step (Megatron logs it)
  std::optional<double> decoupled_learning_rate;  // --decoupled-lr
  double loss_scale = 1;
  std::vector<std::pair<std::string, double>> tensorboard_scalars;  // at the iteration only
  // MoE: per layer of the model (empty for a dense one), the tokens routed to each expert.
  std::vector<std::vector<double>> moe_tokens_per_expert;
};

class MetricsWriter {
 public:
  // `comm` accumulates this rank's time in collectives (its share per iteration is logged).
  // `loss_names`: the family's named losses ("lm loss" first).
  MetricsWriter(const TrainingArgs& a, int64_t train_iters, bool log_rank, int world_size,
                std::shared_ptr<const CommStats> comm, std::vector<std::string> loss_names);
  // After each iteration; writes the interval's line when the iteration ends one.
  void record(const IterationRecord& r);
  void log_validation(int64_t iteration, int64_t consumed_samples, const NamedLosses& losses);
  // Evaluation time is not training time: the interval's clock restarts after it.
  void restart_interval_clock() { interval_t0_ = Clock::now(); }

 private:
  using Clock = std::chrono::steady_clock;
  void write_interval(const IterationRecord& r);
  void write_expert_shares();  // the interval's "moe_expert_token_shares" entry, if any

  const TrainingArgs& a_;
  int64_t train_iters_;
  bool log_rank_;
  int world_size_;
  std::shared_ptr<const CommStats> comm_;
  FlopsModel flops_;
  std::ofstream jsonl_;
  TrainingTensorBoard tensorboard_;
  // The current interval.
  int64_t iters_ = 0, advanced_ = 0, skipped_ = 0, nan_ = 0, samples_ = 0;
  double flops_sum_ = 0;  // the batch size may change between iterations
  double loss_sum_ = 0, grad_norm_ = std::nan("");
  double comm0_ = 0;
  std::vector<std::string> loss_names_;
  std::vector<double> more_sums_;  // per further loss, over the interval's advanced iterations
  std::vector<std::vector<double>> expert_tokens_;  // per layer and expert, over the interval
  Clock::time_point interval_t0_ = Clock::now();
};

}  // namespace megatron::training
