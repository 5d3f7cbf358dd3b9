// --mock-data: Megatron's synthetic GPT documents (megatron/core/datasets/gpt_dataset.py,
// MockGPTLowLevelDataset), so a script runs without --data-path. 100000 documents; document i has
// length L_i drawn by numpy.random.default_rng(seed=0).integers(low=1, high=4096, size=100000,
// dtype=int32) (PCG64 seeded through SeedSequence, Lemire's bounded draws: reproduced exactly by
// NumpyPCG64 below) and holds the tokens 1, 2, ..., L_i - 1 followed by the EOD id. The splits,
// sample and shuffle indices are built over them exactly as for real data (GPTDataset, seed
// --seed), with the split forced to "1,1,1" as Megatron's BlendedMegatronDatasetConfig does when
// no blend is given. Worked example: L_0 = 3484, so document 0 is 1 2 ... 3483 EOD.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace megatron::data {

// numpy.random.default_rng(seed) as far as --mock-data needs it: SeedSequence(seed) ->
// PCG64 (XSL-RR 128/64), next_uint32 halves of each 64-bit output (low first), and
// Generator.integers(low, high, dtype=int32) by Lemire's rejection method.
class NumpyPCG64 {
 public:
  explicit NumpyPCG64(uint64_t seed);
  uint64_t next_uint64();
  uint32_t next_uint32();
  // Generator.integers(low, high) for int32 (high exclusive, low < high).
  int32_t integers_int32(int32_t low, int32_t high);

 private:
  __extension__ typedef unsigned __int128 u128;
  u128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

class MockGPTLowLevelDataset : public LowLevelDataset {
 public:
  static constexpr int64_t kSize = 100000;            // Megatron's hard-coded size
  static constexpr int32_t kMaxSequenceLength = 4096;  // exclusive bound of the lengths
  explicit MockGPTLowLevelDataset(int32_t eod_id);

  int64_t num_sequences() const override { return kSize; }
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  int64_t sequence_length(int64_t i) const override;
  void read(int64_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const override;
  const std::string& prefix() const override { return prefix_; }

 private:
  std::vector<int32_t> lengths_;
  int32_t eod_;
  std::string prefix_;  // none: mock data has no files
};

}  // namespace megatron::data
