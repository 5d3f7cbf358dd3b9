// Counter-based random numbers (Philox4x32-10). A stream is (seed, stream id); element i of a
// stream is a pure function of (seed, stream, i), so random tensors are identical whatever the
// thread count, rank count or the order in which elements are produced. Dropout masks and weight
// initialisation draw from here with explicit offsets.
#pragma once

#include <array>
#include <cstdint>

namespace megatron {

using Philox4 = std::array<uint32_t, 4>;

// One Philox4x32-10 block: counter (4 words) under key (2 words).
Philox4 philox4x32_10(Philox4 counter, std::array<uint32_t, 2> key);

class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  // Four 32-bit words for block `index` of this stream.
  Philox4 block(uint64_t index) const;
  // The i-th 32-bit word of the stream.
  uint32_t u32(uint64_t i) const { return block(i >> 2)[i & 3]; }
  // Uniform float in [0, 1) with 24 random bits, the i-th of the stream.
  float uniform(uint64_t i) const { return float(u32(i) >> 8) * (1.0f / 16777216.0f); }
  // Standard normal, the i-th of the stream (Box-Muller over block i: uses words 0 and 1).
  float normal(uint64_t i) const;
  // Fill `n` values starting at element `offset` of the stream.
  void fill_uniform(float* out, int64_t n, uint64_t offset = 0) const;
  void fill_normal(float* out, int64_t n, float mean, float stddev, uint64_t offset = 0) const;

 private:
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace megatron
