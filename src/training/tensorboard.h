// TensorBoard scalars (--tensorboard-dir), written by hand: no TensorFlow, no protobuf library.
//
// An event file is a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32
//   masked_crc32c(data)
// where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 for c = CRC-32C (Castagnoli) of x.
// Each record's data is a serialized tensorflow.Event protobuf:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record carries only file_version = "brain.Event:2"; every scalar is one Event with
// one Summary.Value. Worked example: add_scalar("lm loss", 2.5, 7) at wall time 1.5 s encodes as
//   09 00 00 00 00 00 00 f8 3f      wall_time (field 1, fixed64 double 1.5)
//   10 07                           step (field 2, varint 7)
//   2a 10 0a 0e 0a 07 "lm loss" 15 00 00 20 40
//                                   summary (field 5) { value (field 1) { tag, simple_value 2.5f } }
// File name: events.out.tfevents.<unix seconds>.<hostname> (".N" appended if that exists).
//
// TrainingTensorBoard puts Megatron's training_log / evaluate_and_print_results tags on top
// (see its comment); the trainer calls it where it logs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <string_view>

namespace megatron::training {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// The serialized Event of one scalar (the worked example above) and a whole TFRecord frame.
std::string encode_scalar_event(const std::string& tag, float value, int64_t step, double wall_time);
std::string tfrecord_frame(std::string_view data);

// One event file. Events are buffered; flush() hands them to the OS so that a running
// TensorBoard sees them. max_queue events written without a flush trigger one (Megatron's
// --tensorboard-queue-size). Throws megatron::Error when the folder or file cannot be written.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::filesystem::path& log_dir, int64_t max_queue = 1000);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // wall_time < 0: now.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::filesystem::path path_;
  std::ofstream out_;
  int64_t max_queue_ = 1000;
  int64_t queued_ = 0;
};

// Megatron's TensorBoard flags (megatron/training/arguments.py, logging group).
struct TensorBoardOptions {
  std::string dir;                  // --tensorboard-dir; empty: no TensorBoard output
  int64_t log_interval = 1;         // --tensorboard-log-interval
  int64_t queue_size = 1000;        // --tensorboard-queue-size
  bool log_timers = false;          // --log-timers-to-tensorboard ('iteration-time')
  bool log_learning_rate = true;    // --no-log-learnig-rate-to-tensorboard (sic) turns off
  bool log_loss_scale = true;       // --no-log-loss-scale-to-tensorboard turns off
  bool log_batch_size = false;      // --log-batch-size-to-tensorboard
  bool log_world_size = false;      // --log-world-size-to-tensorboard
  bool log_validation_ppl = false;  // --log-validation-ppl-to-tensorboard
};

// What one training iteration reports (after it: consumed_samples includes its batch).
struct IterationScalars {
  int64_t iteration = 0, consumed_samples = 0;
  double learning_rate = 0;
  int64_t batch_size = 0;
  std::optional<double> lm_loss;    // none for a skipped (inf/NaN) iteration
  // The family's further losses ("sop loss"), logged under their names after "lm loss".
  std::vector<std::pair<std::string, double>> more_losses;
  double loss_scale = 1.0;
  std::optional<double> grad_norm;  // none for a skipped iteration
  int64_t world_size = 1;
  // Written at the iteration only (no "vs samples"): --moe-per-layer-logging's per-layer losses.
  std::vector<std::pair<std::string, double>> scalars;
};

// Megatron's scalars, each under its tag at the iteration and, for "<tag> vs samples", at the
// consumed training samples:
//  every --tensorboard-log-interval iterations: learning-rate, batch-size (opt-in), lm loss,
//    loss-scale, world-size (opt-in), grad-norm (the last two skipped on skipped iterations);
//  every --log-interval: iteration-time in seconds (--log-timers-to-tensorboard), throughput in
//    TFLOP/s per device (--log-throughput), then a flush;
//  every evaluation: "<loss> validation" for each named loss ("lm loss", then e.g. "sop loss")
//    and, with --log-validation-ppl-to-tensorboard, "<loss> validation ppl" (exp of min(20,
//    loss)), then a flush.
// Disabled (every call a no-op) when options.dir is empty.
class TrainingTensorBoard {
 public:
  explicit TrainingTensorBoard(const TensorBoardOptions& options);
  bool enabled() const { return writer_ != nullptr; }
  void log_iteration(const IterationScalars& s);
  void log_interval(int64_t iteration, double seconds_per_iteration,
                    std::optional<double> tflops_per_device);
  void log_validation(int64_t iteration, int64_t consumed_samples,
                      const std::vector<std::pair<std::string, double>>& losses);
  void flush();
  const EventFileWriter* writer() const { return writer_.get(); }

 private:
  void both(const std::string& tag, double value, int64_t iteration, int64_t samples);

  TensorBoardOptions options_;
  std::unique_ptr<EventFileWriter> writer_;
};

}  // namespace megatron::training
