// Reading TensorBoard event files back (the format training/tensorboard.h writes, and PyTorch's
// SummaryWriter and TensorFlow write): TFRecord frames with masked CRC-32C checks, each a
// tensorflow.Event whose Summary values carry a tag and a simple_value (field 2) or a one-element
// float tensor (field 8, TensorProto float_val / tensor_content). Unknown fields are skipped by
// wire type. A file still being written may end in a partial frame: reading stops there without
// an error, so a report of a running job shows what is complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace megatron::report {

struct Scalar {
  int64_t step = 0;
  double value = 0;
  double wall_time = 0;
};

struct EventFile {
  std::filesystem::path path;
  int64_t records = 0;
  bool truncated = false;  // ended inside a frame (a writer still at work)
  std::map<std::string, std::vector<Scalar>> scalars;  // by tag, in file order
};

// Throws megatron::Error naming the file and offset for a frame whose checksum is wrong or whose
// event cannot be decoded (a damaged file), and when the file cannot be read.
EventFile read_event_file(const std::filesystem::path& path);

// Every events.out.tfevents.* file under `dir` (recursively), merged by tag, sorted by step.
std::map<std::string, std::vector<Scalar>> read_event_dir(
    const std::filesystem::path& dir, std::vector<std::filesystem::path>* files = nullptr);

}  // namespace megatron::report
