// The training loop's log lines, JSONL metrics and TensorBoard scalars (metrics_writer.h).
#include "training/metrics_writer.h"

#include <algorithm>
#include <cmath>
#include <iomanip>

#include "core/error.h"
#include "core/log.h"

namespace megatron::training {

namespace {

TensorBoardOptions tensorboard_options(const TrainingArgs& a, bool log_rank) {
  TensorBoardOptions o = a.tensorboard;
  if (!log_rank) o.dir.clear();
  return o;
}

}  // namespace

MetricsWriter::MetricsWriter(const TrainingArgs& a, int64_t train_iters, bool log_rank,
                             int world_size, std::shared_ptr<const CommStats> comm,
                             std::vector<std::string> loss_names)
    : a_(a),
      train_iters_(train_iters),
      log_rank_(log_rank),
      world_size_(world_size),
      comm_(std::move(comm)),
      flops_(flops_model(a.model)),
      tensorboard_(tensorboard_options(a, log_rank)),
      comm0_(comm_->seconds),
      loss_names_(std::move(loss_names)),
      more_sums_(loss_names_.empty() ? 0 : loss_names_.size() - 1, 0.0) {
  if (!a.metrics_jsonl.empty() && log_rank) {
    jsonl_.open(a.metrics_jsonl, std::ios::app);
    MG_REQUIRE(jsonl_.good(), "--log-metrics-jsonl: cannot open ", a.metrics_jsonl, " for writing");
    jsonl_ << std::setprecision(17);  // round-trip exact: resumed runs compare bitwise
  }
}

void MetricsWriter::record(const IterationRecord& r) {
  const bool skipped = r.step.skipped;
  samples_ += r.global_batch_size;
  flops_sum_ += flops_per_iteration(flops_, r.global_batch_size);
  ++iters_;
  if (skipped) {
    ++skipped_;
    if (!std::isfinite(r.loss)) ++nan_;
  } else {
    ++advanced_;
    loss_sum_ += r.loss;
    for (size_t k = 0; k < more_sums_.size() && k < r.more_losses.size(); ++k)
      more_sums_[k] += r.more_losses[k];
    grad_norm_ = r.step.grad_norm;
  }
  if (expert_tokens_.size() < r.moe_tokens_per_expert.size()) expert_tokens_.resize(r.moe_tokens_per_expert.size());
  for (size_t l = 0; l < r.moe_tokens_per_expert.size(); ++l) {
    const std::vector<double>& t = r.moe_tokens_per_expert[l];
    expert_tokens_[l].resize(std::max(expert_tokens_[l].size(), t.size()), 0.0);
    for (size_t e = 0; e < t.size(); ++e) expert_tokens_[l][e] += t[e];
  }
  NamedLosses more;
  for (size_t k = 0; k < more_sums_.size() && k < r.more_losses.size(); ++k)
    more.emplace_back(loss_names_[k + 1], r.more_losses[k]);
  tensorboard_.log_iteration({r.iteration, r.consumed_samples, r.learning_rate, r.global_batch_size,
                              skipped ? std::nullopt : std::optional<double>(r.loss), more,
                              r.loss_scale,
                              skipped ? std::nullopt : std::optional<double>(r.step.grad_norm),
                              world_size_, r.tensorboard_scalars});
  if (r.iteration % a_.log_interval == 0 || r.iteration == train_iters_) write_interval(r);
}

void MetricsWriter::write_interval(const IterationRecord& r) {
  const double secs = std::chrono::duration<double>(Clock::now() - interval_t0_).count();
  IntervalStats s;
  s.iteration = r.iteration;
  s.train_iters = train_iters_;
  s.consumed_samples = r.consumed_samples;
  s.elapsed_ms_per_iter = secs * 1000.0 / double(iters_);
  s.log_throughput = a_.log_throughput;
  s.tflops_per_device = flops_sum_ / secs / 1e12 / world_size_;
  s.learning_rate = r.learning_rate;
  s.decoupled_learning_rate = r.decoupled_learning_rate;
  s.global_batch_size = r.global_batch_size;
  s.lm_loss = advanced_ > 0 ? loss_sum_ / double(advanced_) : r.loss;
  for (size_t k = 0; k < more_sums_.size(); ++k)
    s.more_losses.emplace_back(loss_names_[k + 1],
                               advanced_ > 0 ? more_sums_[k] / double(advanced_)
                               : k < r.more_losses.size() ? r.more_losses[k] : std::nan(""));
  s.loss_scale = r.loss_scale;
  s.grad_norm = grad_norm_;
  s.skipped_iterations = skipped_;
  s.nan_iterations = nan_;
  s.tokens_per_second = double(samples_ * a_.model.seq_length) / secs;
  const double comm_ms = (comm_->seconds - comm0_) * 1000.0 / double(iters_);
  if (log_rank_) log_print(format_log_line(s));
  if (jsonl_.is_open()) {
    jsonl_ << "{\"iteration\": " << r.iteration << ", \"consumed_samples\": " << r.consumed_samples
           << ", \"lm_loss\": " << s.lm_loss;
    for (const auto& [name, value] : s.more_losses) {
      std::string key = name;
      std::replace(key.begin(), key.end(), ' ', '_');
      jsonl_ << ", \"" << key << "\": " << value;
    }
    jsonl_ << ", \"learning_rate\": " << r.learning_rate
           << ", \"loss_scale\": " << s.loss_scale << ", \"grad_norm\": "
           << (std::isnan(grad_norm_) ? std::string("null") : str(std::setprecision(17), grad_norm_))
           << ", \"ms_per_iteration\": " << s.elapsed_ms_per_iter
           << ", \"tokens_per_second\": " << s.tokens_per_second
           << ", \"comm_ms_per_iteration\": " << comm_ms << ", \"world_size\": " << world_size_
           << ", \"skipped_iterations\": " << skipped_;
    write_expert_shares();
    jsonl_ << "}\n";
    jsonl_.flush();
  }
  tensorboard_.log_interval(r.iteration, secs / double(iters_),
                            a_.log_throughput ? std::optional<double>(s.tflops_per_device) : std::nullopt);
  iters_ = advanced_ = skipped_ = nan_ = samples_ = 0;
  flops_sum_ = 0;
  loss_sum_ = 0;
  std::fill(more_sums_.begin(), more_sums_.end(), 0.0);
  expert_tokens_.clear();
  grad_norm_ = std::nan("");
  interval_t0_ = Clock::now();
  comm0_ = comm_->seconds;
}

void MetricsWriter::write_expert_shares() {
  bool first = true;
  for (size_t l = 0; l < expert_tokens_.size(); ++l) {
    const std::vector<double>& t = expert_tokens_[l];
    if (t.empty()) continue;
    double total = 0;
    for (double v : t) total += v;
    jsonl_ << (first ? ", \"moe_expert_token_shares\": {\"" : ", \"") << l << "\": [";
    for (size_t e = 0; e < t.size(); ++e) jsonl_ << (e ? ", " : "") << (total > 0 ? t[e] / total : 0.0);
    jsonl_ << "]";
    first = false;
  }
  if (!first) jsonl_ << "}";
}

void MetricsWriter::log_validation(int64_t iteration, int64_t consumed_samples,
                                   const NamedLosses& losses) {
  tensorboard_.log_validation(iteration, consumed_samples, losses);
}

}  // namespace megatron::training
