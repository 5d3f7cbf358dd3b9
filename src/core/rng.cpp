#include "core/rng.h"

#include <cmath>

namespace megatron {

Philox4 philox4x32_10(Philox4 ctr, std::array<uint32_t, 2> key) {
  philox4x32_10_words(ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1]);
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
