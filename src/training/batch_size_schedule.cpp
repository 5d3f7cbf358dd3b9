// See batch_size_schedule.h.
#include "training/batch_size_schedule.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace megatron::training {

BatchSizeSchedule BatchSizeSchedule::constant(int64_t global_batch_size) {
  BatchSizeSchedule s;
  s.kind_ = Kind::Constant;
  s.final_ = global_batch_size;
  return s;
}

BatchSizeSchedule BatchSizeSchedule::rampup(int64_t start, int64_t increment, int64_t ramp_samples,
                                            int64_t global_batch_size) {
  MG_REQUIRE(global_batch_size > 0, "--rampup-batch-size needs --global-batch-size (the batch size "
             "after the ramp-up), got ", global_batch_size);
  MG_REQUIRE(start > 0, "--rampup-batch-size: start batch size should be positive, got ", start);
  MG_REQUIRE(increment > 0, "--rampup-batch-size: batch size increment should be positive, got ", increment);
  MG_REQUIRE(ramp_samples >= 0, "--rampup-batch-size: ramp-up samples should be non-negative, got ",
             ramp_samples);
  const int64_t diff = global_batch_size - start;
  MG_REQUIRE(diff >= 0, "--rampup-batch-size: expected --global-batch-size (", global_batch_size,
             ") to be greater than or equal to the start batch size (", start, ")");
  MG_REQUIRE(diff % increment == 0, "--rampup-batch-size: the global batch size interval (",
             diff, " = --global-batch-size ", global_batch_size, " - start ", start,
             ") must be divisible by the batch size increment (", increment, ")");
  // Megatron divides the ramp-up samples by the number of increments: none (start == global) is
  // a ZeroDivisionError there.
  MG_REQUIRE(diff > 0, "--rampup-batch-size: the start batch size equals --global-batch-size (",
             global_batch_size, "): there is nothing to ramp up; drop --rampup-batch-size");
  BatchSizeSchedule s;
  s.kind_ = Kind::Rampup;
  s.final_ = global_batch_size;
  s.start_ = start;
  s.increment_ = increment;
  s.ramp_samples_ = ramp_samples;
  s.samples_per_increment_ = double(ramp_samples) / double(diff / increment);
  return s;
}

namespace {

// Megatron's _parse_numeric_value: optional K/M/B/T suffix, int(float(value) * multiplier).
int64_t parse_schedule_number(std::string v, const std::string& entry) {
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.erase(v.begin());
  for (auto& ch : v) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  double mult = 1;
  if (!v.empty()) {
    switch (v.back()) {
      case 'T': mult = 1e12; v.pop_back(); break;
      case 'B': mult = 1e9; v.pop_back(); break;
      case 'M': mult = 1e6; v.pop_back(); break;
      case 'K': mult = 1e3; v.pop_back(); break;
      default: break;
    }
  }
  char* end = nullptr;
  const double x = v.empty() ? NAN : std::strtod(v.c_str(), &end);
  MG_REQUIRE(!v.empty() && end != nullptr && *end == 0 && std::isfinite(x) && x * mult < 9e18 &&
                 x * mult > -9e18,
             "--step-batch-size-schedule: '", entry, "' is not THRESHOLD:BATCH_SIZE with numbers "
             "(suffixes K, M, B, T allowed), e.g. \"0:256 100B:512\"");
  return int64_t(x * mult);
}

}  // namespace

BatchSizeSchedule BatchSizeSchedule::step(const std::string& schedule, int64_t seq_length) {
  MG_REQUIRE(seq_length > 0, "--step-batch-size-schedule needs --seq-length (thresholds are tokens)");
  std::string text = schedule;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream in(text);
  std::vector<std::pair<int64_t, int64_t>> steps;
  for (std::string entry; in >> entry;) {
    const size_t colon = entry.find(':');
    MG_REQUIRE(colon != std::string::npos, "--step-batch-size-schedule: invalid schedule entry \"",
               entry, "\"; expected format \"THRESHOLD:BATCH_SIZE\"");
    const int64_t tokens = parse_schedule_number(entry.substr(0, colon), entry);
    const int64_t batch = parse_schedule_number(entry.substr(colon + 1), entry);
    // Python's // on the token threshold (floor, also for negatives).
    int64_t samples = tokens / seq_length;
    if (tokens % seq_length != 0 && tokens < 0) --samples;
    steps.emplace_back(samples, batch);
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  MG_REQUIRE(!steps.empty(), "--step-batch-size-schedule: the schedule must have at least one entry");
  MG_REQUIRE(steps[0].first == 0, "--step-batch-size-schedule: the first entry must have threshold 0, got ",
             steps[0].first, " samples");
  for (size_t i = 1; i < steps.size(); ++i)
    MG_REQUIRE(steps[i].first > steps[i - 1].first,
               "--step-batch-size-schedule: thresholds must be strictly increasing, got ",
               steps[i - 1].first, " before ", steps[i].first, " samples (tokens // --seq-length ",
               seq_length, ")");
  for (const auto& [threshold, batch] : steps)
    MG_REQUIRE(batch > 0, "--step-batch-size-schedule: batch size must be positive, got ", batch);
  BatchSizeSchedule s;
  s.kind_ = Kind::Step;
  s.steps_ = std::move(steps);
  s.final_ = s.steps_.back().second;
  return s;
}

int64_t BatchSizeSchedule::global_batch_size(int64_t consumed) const {
  switch (kind_) {
    case Kind::Constant: return final_;
    case Kind::Rampup: {
      if (consumed > ramp_samples_) return final_;
      const int64_t steps = int64_t(double(consumed) / samples_per_increment_);  // int() truncates
      return start_ + steps * increment_;
    }
    case Kind::Step: {
      int64_t batch = steps_[0].second;
      for (const auto& [threshold, b] : steps_) {
        if (consumed < threshold) break;
        batch = b;
      }
      return batch;
    }
  }
  return final_;
}

int64_t BatchSizeSchedule::train_iters_for_samples(int64_t train_samples) const {
  auto floordiv = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  switch (kind_) {
    case Kind::Constant: return train_samples / final_;
    case Kind::Rampup: {
      int64_t iterations = 0, consumed = 0;
      while (consumed <= ramp_samples_) {
        consumed += global_batch_size(consumed);
        ++iterations;
      }
      // "Note that we throw away any partial last batch."
      return iterations + floordiv(train_samples - consumed, final_);
    }
    case Kind::Step: {
      int64_t iterations = 0, consumed = 0;
      for (int64_t b = global_batch_size(0); consumed + b <= train_samples; b = global_batch_size(consumed)) {
        consumed += b;
        ++iterations;
      }
      return iterations;
    }
  }
  return 0;
}

void BatchSizeSchedule::validate_against(int64_t consumed, int64_t start_iteration, int64_t train_iters,
                                         int64_t micro_batch, int64_t dp, int64_t pipeline_multiple) const {
  const int64_t unit = micro_batch * dp;
  const char* flag = kind_ == Kind::Rampup ? "--rampup-batch-size"
                     : kind_ == Kind::Step  ? "--step-batch-size-schedule"
                                            : "--global-batch-size";
  int64_t previous = 0;
  for (int64_t it = start_iteration + 1; it <= train_iters; ++it) {
    const int64_t b = global_batch_size(consumed);
    if (b != previous) {  // each distinct batch size once
      MG_REQUIRE(b % unit == 0, flag, ": the global batch size of iteration ", it, " (", b, ", after ",
                 consumed, " consumed samples) is not divisible by --micro-batch-size (", micro_batch,
                 ") times data parallel size (", dp, ")");
      MG_REQUIRE(pipeline_multiple <= 1 || (b / unit) % pipeline_multiple == 0, flag,
                 ": the global batch size of iteration ", it, " (", b, ") gives ", b / unit,
                 " micro-batches per data-parallel rank, not a multiple of "
                 "--pipeline-model-parallel-size ", pipeline_multiple,
                 " as the interleaved schedule requires");
      MG_REQUIRE(previous == 0 || b >= previous, flag, ": the number of micro-batches must not "
                 "decrease during training (", previous, " -> ", b, " at iteration ", it, ")");
      previous = b;
    }
    consumed += b;
  }
}

std::string BatchSizeSchedule::describe() const {
  std::ostringstream o;
  switch (kind_) {
    case Kind::Constant: o << "constant global batch size " << final_; break;
    case Kind::Rampup:
      o << "batch size rampup starting from global batch size " << start_ << " to global batch size "
        << final_ << " with batch size increments " << increment_ << " over " << ramp_samples_
        << " samples";
      break;
    case Kind::Step:
      o << "step batch size schedule (" << steps_.size() << " steps):";
      for (const auto& [t, b] : steps_) o << " >= " << t << " samples -> " << b << ";";
      break;
  }
  return o.str();
}

}  // namespace megatron::training
