// What `megatron report` knows about a run, read from its files while it may still be writing
// them: Megatron's log lines (the interval line, the validation and test lines, the arguments
// block, report_memory lines, the parallel layout line, checkpoint saves), the JSONL metrics of
// --log-metrics-jsonl, the TensorBoard events of --tensorboard-dir and the checkpoints of --save.
// Lines are matched by their fields, not their positions, so Megatron-LM's own logs (with fields
// this build does not print) read too; a partial last line or frame is ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "report/tfevents_reader.h"

namespace megatron::report {

struct Interval {  // one interval log line (with its JSONL object when there is one)
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0, global_batch_size = 0;
  double ms_per_iteration = 0;
  std::optional<double> tflops_per_device;  // "throughput per GPU (TFLOP/s/GPU)"
  std::optional<double> tokens_per_second;
  double learning_rate = 0, lm_loss = 0, loss_scale = 1;
  std::optional<double> grad_norm;
  int64_t skipped = 0, nan = 0;
  std::optional<double> comm_ms_per_iteration;  // JSONL only
  std::optional<double> seconds;  // the line's timestamp, seconds since the first one's day
};

struct Evaluation {
  int64_t iteration = 0;
  std::string split;  // "validation" or "test"
  double loss = 0, ppl = 0;
};

struct MemoryLine {
  int rank = 0;
  int64_t iteration = 0;
  double allocated = 0, max_allocated = 0, reserved = 0, max_reserved = 0;  // MiB
};

struct Checkpoint {
  int64_t iteration = 0;
  std::string dir;
  double bytes = 0;
  std::string saved;  // file time, "YYYY-MM-DD HH:MM:SS"
};

struct RunRecord {
  std::vector<std::string> sources;  // files read
  std::vector<Interval> intervals;
  std::vector<Evaluation> evaluations;
  std::vector<MemoryLine> memory;
  std::vector<std::pair<std::string, std::string>> arguments;  // the arguments block, in order
  std::string layout;                                          // the "parallel layout:" line
  bool finished = false;                                       // the run printed its end
  std::map<std::string, std::vector<Scalar>> scalars;          // TensorBoard, by tag
  std::vector<Checkpoint> checkpoints;
  std::optional<std::string> argument(const std::string& name) const;
  int64_t world_size() const;  // from the layout line, the JSONL or the arguments; 1 if unknown
};

struct RunSources {
  std::vector<std::filesystem::path> logs, metrics;
  std::vector<std::filesystem::path> tensorboard_dirs, checkpoint_dirs;
};

// The files of RUN: a log file itself, or a folder searched (three levels deep) for logs (*.log,
// *.txt, *.out holding Megatron's interval lines), metrics (*.jsonl), TensorBoard event files and
// checkpoint folders (with latest_checkpointed_iteration.txt). megatron::Error when RUN does not
// exist or holds none of them.
RunSources find_run_sources(const std::filesystem::path& run);

// Reads them (and the --save and --tensorboard-dir folders the arguments name, when they exist).
RunRecord read_run(const RunSources& sources);

// Parses Megatron's log text into `r` (exposed for tests).
void parse_log(const std::string& text, RunRecord& r);

}  // namespace megatron::report
