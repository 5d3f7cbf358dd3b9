// TensorBoard event files by hand; see tensorboard.h for the format.
#include "training/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace megatron::training {

namespace fs = std::filesystem;

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}

template <typename T>
void put_le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(char(uint8_t(uint64_t(v) >> (8 * i))));
}

// Protobuf keys: (field << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_varint(out, uint64_t(field) << 3 | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_varint(e, 1 << 3 | 1);
  put_le(e, std::bit_cast<uint64_t>(wall_time));
  put_varint(e, 2 << 3 | 0);
  put_varint(e, uint64_t(step));  // int64: negative values as 10-byte two's complement
  return e;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;
  put_bytes_field(v, 1, tag);
  put_varint(v, 2 << 3 | 5);
  put_le(v, std::bit_cast<uint32_t>(value));
  std::string summary;
  put_bytes_field(summary, 1, v);
  std::string e = event_header(wall_time, step);
  put_bytes_field(e, 5, summary);
  return e;
}

std::string tfrecord_frame(std::string_view data) {
  std::string len;
  put_le(len, uint64_t(data.size()));
  std::string f = len;
  put_le(f, masked_crc32c(len));
  f.append(data);
  put_le(f, masked_crc32c(data));
  return f;
}

EventFileWriter::EventFileWriter(const fs::path& log_dir, int64_t max_queue)
    : max_queue_(std::max<int64_t>(max_queue, 1)) {
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  MG_REQUIRE(!ec && fs::is_directory(log_dir), "--tensorboard-dir ", log_dir.string(),
             ": cannot create the folder (", ec.message(), ")");
  const std::string base = str("events.out.tfevents.", int64_t(unix_now()), ".", hostname());
  path_ = log_dir / base;
  for (int n = 1; fs::exists(path_); ++n) path_ = log_dir / str(base, ".", n);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  MG_REQUIRE(out_.good(), "--tensorboard-dir: cannot write ", path_.string(),
             "; check that the folder is writable");
  std::string e = event_header(unix_now(), 0);
  put_bytes_field(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (...) {
    // A destructor must not throw; the last flush's failure is lost.
  }
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step,
                                 double wall_time) {
  write_record(encode_scalar_event(tag, float(value), step, wall_time < 0 ? unix_now() : wall_time));
  if (++queued_ >= max_queue_) flush();
}

void EventFileWriter::write_record(const std::string& data) {
  const std::string f = tfrecord_frame(data);
  out_.write(f.data(), std::streamsize(f.size()));
}

void EventFileWriter::flush() {
  out_.flush();
  queued_ = 0;
  MG_REQUIRE(out_.good(), "write failed: ", path_.string(), " (disk full?)");
}

// ---- Megatron's training scalars ----------------------------------------------------------

TrainingTensorBoard::TrainingTensorBoard(const TensorBoardOptions& options) : options_(options) {
  if (options_.dir.empty()) return;
  MG_REQUIRE(options_.log_interval > 0, "--tensorboard-log-interval must be > 0");
  MG_REQUIRE(options_.queue_size > 0, "--tensorboard-queue-size must be > 0");
  writer_ = std::make_unique<EventFileWriter>(options_.dir, options_.queue_size);
}

void TrainingTensorBoard::both(const std::string& tag, double value, int64_t iteration,
                               int64_t samples) {
  writer_->add_scalar(tag, value, iteration);
  writer_->add_scalar(tag + " vs samples", value, samples);
}

void TrainingTensorBoard::log_iteration(const IterationScalars& s) {
  if (!writer_ || s.iteration % options_.log_interval != 0) return;
  const int64_t it = s.iteration, n = s.consumed_samples;
  if (options_.log_learning_rate) both("learning-rate", s.learning_rate, it, n);
  if (options_.log_batch_size) both("batch-size", double(s.batch_size), it, n);
  if (s.lm_loss) {
    both("lm loss", *s.lm_loss, it, n);
    for (const auto& [name, value] : s.more_losses) both(name, value, it, n);
  }
  if (options_.log_loss_scale) both("loss-scale", s.loss_scale, it, n);
  if (options_.log_world_size) both("world-size", double(s.world_size), it, n);
  if (s.grad_norm) both("grad-norm", *s.grad_norm, it, n);
  for (const auto& [tag, value] : s.scalars) writer_->add_scalar(tag, value, it);
}

void TrainingTensorBoard::log_interval(int64_t iteration, double seconds_per_iteration,
                                       std::optional<double> tflops_per_device) {
  if (!writer_) return;
  if (options_.log_timers) writer_->add_scalar("iteration-time", seconds_per_iteration, iteration);
  if (tflops_per_device) writer_->add_scalar("throughput", *tflops_per_device, iteration);
  writer_->flush();
}

void TrainingTensorBoard::log_validation(
    int64_t iteration, int64_t consumed_samples,
    const std::vector<std::pair<std::string, double>>& losses) {
  if (!writer_) return;
  for (const auto& [name, loss] : losses) {
    both(name + " validation", loss, iteration, consumed_samples);
    if (options_.log_validation_ppl)
      both(name + " validation ppl", std::exp(std::min(20.0, loss)), iteration, consumed_samples);
  }
  writer_->flush();
}

void TrainingTensorBoard::flush() {
  if (writer_) writer_->flush();
}

}  // namespace megatron::training
