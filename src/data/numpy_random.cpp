// NumPy legacy bounded integers (numpy/random/src/distributions: random_interval) and geometric draws.
#include "data/numpy_random.h"

#include <cmath>

#include "core/error.h"

namespace megatron::data {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

int64_t NumpyRandomState::randint(int64_t low, int64_t high) {
  MG_CHECK(low < high);
  return low + int64_t(random_interval(uint64_t(high) - uint64_t(low) - 1));
}

int64_t NumpyRandomState::geometric(double p) {
  MG_CHECK(p > 0.0 && p <= 1.0);
  const double u = random();
  if (p >= 0.333333333333333333333333) {
    int64_t x = 1;
    double sum = p, prod = p;
    const double q = 1.0 - p;
    while (u > sum) {
      prod *= q;
      sum += prod;
      ++x;
    }
    return x;
  }
  return int64_t(std::ceil(std::log1p(-u) / std::log(1.0 - p)));
}

}  // namespace megatron::data
