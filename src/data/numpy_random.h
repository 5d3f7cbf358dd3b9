// NumPy's legacy RandomState (MT19937) as far as Megatron's dataset code uses it: seeding with a
// 32-bit integer (init_genrand), shuffle of a 1-D array or list, permutation(n), random() and
// randint(low, high), geometric(p). Megatron builds its
// document and shuffle indices with np.random.RandomState(seed).shuffle, so reproducing the same
// sample order needs the same generator and the same bounded-integer algorithm: Fisher-Yates
// from the end, j drawn in [0, i] by masked rejection on 32-bit outputs (64-bit outputs, high word
// first, when i > 2^32-1). std::mt19937 has the same seeding and output as NumPy's MT19937.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace megatron::data {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t next_uint32() { return uint32_t(mt_()); }
  uint64_t next_uint64() {
    uint64_t hi = next_uint32();
    return (hi << 32) | next_uint32();
  }
  // Uniform integer in [0, max] (NumPy's random_interval).
  uint64_t random_interval(uint64_t max);
  // RandomState.random() (random_sample): 53 random bits from two 32-bit outputs, in [0, 1).
  double random() {
    const uint32_t a = next_uint32() >> 5, b = next_uint32() >> 6;
    return (double(a) * 67108864.0 + double(b)) / 9007199254740992.0;
  }
  // RandomState.randint(low, high) for the default int64 dtype: the masked bounded method, so
  // low + random_interval(high - 1 - low); no draw when high - low == 1. Requires low < high.
  int64_t randint(int64_t low, int64_t high);
  // RandomState.geometric(p) for 0 < p <= 1 (NumPy's legacy_random_geometric): one random()
  // draw u; for p >= 1/3 the smallest X with u <= sum_{k<=X} p (1-p)^(k-1), else
  // ceil(log1p(-u) / log(1 - p)).
  int64_t geometric(double p);

  // In place, identical to RandomState.shuffle on a 1-D array.
  template <typename T>
  void shuffle(std::span<T> x) {
    for (size_t i = x.size(); i-- > 1;) {
      size_t j = size_t(random_interval(i));
      std::swap(x[i], x[j]);
    }
  }
  // RandomState.permutation(n): a shuffled arange(n).
  template <typename T = int64_t>
  std::vector<T> permutation(int64_t n) {
    std::vector<T> v(size_t(n > 0 ? n : 0));
    for (size_t i = 0; i < v.size(); ++i) v[i] = T(i);
    shuffle(std::span<T>(v));
    return v;
  }

 private:
  std::mt19937 mt_;
};

}  // namespace megatron::data
