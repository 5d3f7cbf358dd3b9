// What the training report shows, computed from a RunRecord: the summary numbers, the series of
// every plot (training and validation loss with the unigram baseline, learning rate, gradient
// norm, loss scale and skipped iterations, tokens/s, TFLOP/s per device with MFU against a stated
// dense peak, memory per rank, time per phase) and the tables (layout, checkpoints, arguments).
// TFLOP/s per device is the log's own figure (--log-throughput) or Megatron's FLOPs formula
// (training/metrics.h) over the logged step time and world size, from the run's arguments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/run_record.h"

namespace megatron::report {

struct Series {
  std::string name, color;
  std::vector<double> x, y;
  bool dashed = false, markers = false;
};

struct Plot {
  std::string id, title, x_label, y_label, note;
  std::vector<Series> series;
  bool bars = false;  // x are categories (ranks), drawn as grouped bars
  std::vector<std::string> categories;
};

struct ReportOptions {
  std::string title;                   // the run's name
  std::optional<double> peak_tflops;   // dense peak per device, for MFU
  std::string peak_name;               // where the peak comes from ("h100 (dense bf16)")
  std::optional<double> unigram_loss;  // the data's unigram entropy in nats
  std::string unigram_source;
  int refresh_seconds = 0;  // > 0: the page reloads itself (a running job)
};

struct ReportModel {
  std::string title, status, generated;
  std::vector<std::pair<std::string, std::string>> cards;  // label, value
  std::vector<Plot> plots;
  std::string layout;
  std::vector<std::vector<std::string>> checkpoints, memory, phases, arguments;  // table rows
  std::vector<std::string> sources;
  // Numbers the page carries as data for scripts and tests.
  std::optional<double> last_loss, best_validation_loss, median_tokens_per_second,
      median_tflops_per_device, mfu, unigram_loss;
  int64_t iterations = 0, train_iters = 0;
  int refresh_seconds = 0;
};

ReportModel build_report_model(const RunRecord& run, const ReportOptions& options);

}  // namespace megatron::report
