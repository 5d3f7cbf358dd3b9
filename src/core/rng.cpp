#include "core/rng.h"

#include <cmath>

namespace megatron {

Philox4 philox4x32_10(Philox4 ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(M0) * ctr[0];
    uint64_t p1 = uint64_t(M1) * ctr[2];
    Philox4 next = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1),
                    uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
    ctr = next;
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

Philox4 Philox::block(uint64_t index) const {
  return philox4x32_10({uint32_t(index), uint32_t(index >> 32), uint32_t(stream_),
                        uint32_t(stream_ >> 32)},
                       {uint32_t(seed_), uint32_t(seed_ >> 32)});
}

float Philox::normal(uint64_t i) const {
  Philox4 b = block(i);
  // u1 in (0, 1] so the log is finite.
  double u1 = (double(b[0]) + 1.0) * (1.0 / 4294967296.0);
  double u2 = double(b[1]) * (1.0 / 4294967296.0);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void Philox::fill_uniform(float* out, int64_t n, uint64_t offset) const {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = uniform(offset + uint64_t(i));
}

void Philox::fill_normal(float* out, int64_t n, float mean, float stddev, uint64_t offset) const {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) out[i] = mean + stddev * normal(offset + uint64_t(i));
}

}  // namespace megatron
