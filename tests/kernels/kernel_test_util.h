// Helpers for the op tests: random fp32 tensors, double copies, and the element-wise check
// |got - ref| <= atol + |ref| * eps that every op test uses (any failing element fails; equal
// values pass, so expected infinities such as lse = -inf can be checked).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace megatron::ops::testing {

inline Tensor randn(const Shape& shape, uint64_t stream, float stddev = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  Philox(2024, stream).fill_normal(t.data<float>(), t.numel(), 0.0f, stddev);
  return t;
}

inline std::vector<double> to_double(const Tensor& t) {
  std::vector<float> f = t.to_float_vector();
  return {f.begin(), f.end()};
}

inline void expect_close(const std::string& what, const Tensor& got,
                         const std::vector<double>& ref, double atol, double eps = 1e-5) {
  std::vector<float> g = got.to_float_vector();
  ASSERT_EQ(g.size(), ref.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(double(g[i]) == ref[i] || std::abs(double(g[i]) - ref[i]) <= atol + std::abs(ref[i]) * eps)) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " elements off; first at "
                    << first << ": got " << (first >= 0 ? g[size_t(first)] : 0.f) << " want "
                    << (first >= 0 ? ref[size_t(first)] : 0.0);
}

}  // namespace megatron::ops::testing
