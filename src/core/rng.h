// Counter-based random numbers (Philox4x32-10). A stream is (seed, stream id); element i of a
// stream is a pure function of (seed, stream, i), so random tensors are identical whatever the
// thread count, rank count or the order in which elements are produced. Dropout masks and weight
// initialisation draw from here with explicit offsets.
#pragma once

#include <array>
#include <cstdint>

#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__
#else
#define MG_HOST_DEVICE
#endif

namespace megatron {

using Philox4 = std::array<uint32_t, 4>;

// One Philox4x32-10 round function on plain words, shared by the CPU and the CUDA kernels (which
// must draw the same dropout masks): counter c0..c3 under key k0, k1, in place.
MG_HOST_DEVICE inline void philox4x32_10_words(uint32_t& c0, uint32_t& c1, uint32_t& c2,
                                               uint32_t& c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(M0) * c0;
    const uint64_t p1 = uint64_t(M1) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n1 = uint32_t(p1);
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1, n3 = uint32_t(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += W0;
    k1 += W1;
  }
}

// Word i of stream (seed, stream): the element Philox::u32(i) returns.
MG_HOST_DEVICE inline uint32_t philox_u32(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t block = i >> 2;
  uint32_t c0 = uint32_t(block), c1 = uint32_t(block >> 32), c2 = uint32_t(stream),
           c3 = uint32_t(stream >> 32);
  philox4x32_10_words(c0, c1, c2, c3, uint32_t(seed), uint32_t(seed >> 32));
  const uint32_t w = i & 3;
  return w == 0 ? c0 : (w == 1 ? c1 : (w == 2 ? c2 : c3));
}

// Uniform float in [0, 1) with 24 random bits from a 32-bit word.
MG_HOST_DEVICE inline float philox_word_to_uniform(uint32_t w) {
  return float(w >> 8) * (1.0f / 16777216.0f);
}

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
  float uniform(uint64_t i) const { return philox_word_to_uniform(u32(i)); }
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
