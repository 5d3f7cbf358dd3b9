// The global batch size as a function of the samples consumed so far: Megatron's
// num_microbatches_calculator.py (ConstantNumMicroBatchesCalculator,
// RampupBatchsizeNumMicroBatchesCalculator, StepBatchsizeNumMicroBatchesCalculator) and the
// iteration count of sample-based training (training.py, update_train_iters).
//
// --rampup-batch-size START INCR SAMPLES (global batch G): (G - START) must be a multiple of INCR;
// with per_incr = SAMPLES / ((G - START) / INCR) (a double, as in Python), the batch after c
// consumed samples is G when c > SAMPLES, else START + INCR * int(c / per_incr).
// Worked example: 4 2 12 with G = 8: per_incr = 6; c = 0..5 -> 4, c = 6..11 -> 6, c = 12 -> 8
// (12 / 6 = 2 increments), c > 12 -> 8. Training from 0 takes batches 4, 4 (c = 4), 6 (c = 8),
// 8 (c = 14), 8, ...
//
// --step-batch-size-schedule "T0:B0 T1:B1 ...": from T_k consumed TOKENS on (thresholds are
// converted to samples as T_k // seq-length, as Megatron does when it is given the sequence
// length) the global batch is B_k. Values take K/M/B/T suffixes (1e3 .. 1e12, decimals allowed:
// "1.5K"); entries are separated by spaces or commas; the first threshold must be 0 and they must
// increase strictly. The final global batch size is the last entry's.
//
// Both need sample-based training (--train-samples). Megatron checks at every iteration that
// the current batch divides into micro-batch x data-parallel size; this build checks the
// batches of the whole run before it starts (validate_against), so a bad combination fails at
// once with the iteration where it would have failed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megatron::training {

class BatchSizeSchedule {
 public:
  static BatchSizeSchedule constant(int64_t global_batch_size);
  // Megatron's RampupBatchsizeNumMicroBatchesCalculator checks (errors name the flags).
  static BatchSizeSchedule rampup(int64_t start, int64_t increment, int64_t ramp_samples,
                                  int64_t global_batch_size);
  // Parses and validates the schedule string; thresholds are tokens converted with seq_length.
  static BatchSizeSchedule step(const std::string& schedule, int64_t seq_length);

  enum class Kind { Constant, Rampup, Step };
  Kind kind() const { return kind_; }
  bool is_constant() const { return kind_ == Kind::Constant; }
  // The global batch size of the iteration that starts after `consumed` samples.
  int64_t global_batch_size(int64_t consumed) const;
  // --global-batch-size (rampup, constant) or the schedule's last batch size (step).
  int64_t final_global_batch_size() const { return final_; }
  // (threshold in samples, batch size) of a step schedule, ascending.
  const std::vector<std::pair<int64_t, int64_t>>& steps() const { return steps_; }
  // Megatron's update_train_iters for --train-samples N: constant: N // G; ramp-up: iterations
  // while consumed <= SAMPLES (each with the batch of its consumed count), then
  // (N - consumed) // G more; step schedule: iterations while a whole batch still fits in N.
  int64_t train_iters_for_samples(int64_t train_samples) const;
  // Checks every batch of iterations start_iteration+1 .. train_iters (from `consumed` samples
  // on) divides into micro_batch x dp (and, for the interleaved schedule, that the micro-batch
  // count is a multiple of pipeline_multiple). Errors name the flags and the iteration.
  void validate_against(int64_t consumed, int64_t start_iteration, int64_t train_iters,
                        int64_t micro_batch, int64_t dp, int64_t pipeline_multiple) const;
  // One line describing the schedule (logged at the start).
  std::string describe() const;

 private:
  Kind kind_ = Kind::Constant;
  int64_t final_ = 0;
  int64_t start_ = 0, increment_ = 0, ramp_samples_ = 0;
  double samples_per_increment_ = 0;
  std::vector<std::pair<int64_t, int64_t>> steps_;
};

}  // namespace megatron::training
