// Safetensors files (the Hugging Face format; no code runs on load), read and written in one
// place for checkpoints, inference and converters.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header, then the data region.
// The header is an object {name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
// plus an optional "__metadata__": {string: string}. Offsets are relative to the data region.
// Worked example: one F32 tensor "w" of shape [2] holding 1.0, 2.0:
//   header  {"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   (54 bytes, padded with
//           spaces to 56 so the data starts 8-byte aligned)
//   file    38 00 00 00 00 00 00 00 | header (56 bytes) | 00 00 80 3f 00 00 00 40
//
// Reading validates strictly and throws megatron::Error naming the file and the tensor: header
// length within the file (and <= 100 MiB), well-formed JSON object without duplicate names,
// known dtype, non-negative shape, data_offsets with end - begin == numel * dtype size, and the
// tensors tiling the data region exactly (sorted by offset: contiguous from 0, no overlap, no gap,
// ending at the end of the file; a shorter file is reported as truncated).
// Dtype codes: F64 F32 F16 BF16 I64 I32 I16 I8 U16 U8 (BOOL reads as U8).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace megatron {

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;          // name -> tensor (CPU, contiguous, owns data)
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Reads and validates a file; the tensors own copies of the data.
SafetensorsContents read_safetensors(const std::filesystem::path& file);
// Same, from the file's bytes already in memory; `label` names the file in errors.
SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes, const std::string& label);

// Writes tensors in the given order (the header lists them in that order; data follows in the
// same order), fsyncs and closes. Non-contiguous tensors and tensors on another device are written
// from host copies.
// Names must be unique and must not be "__metadata__".
void write_safetensors(const std::filesystem::path& file,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

const char* safetensors_dtype_code(DType dtype);  // "F32", ...

}  // namespace megatron
