// The optimizer step's kernels on the CPU: the sums (l2_norm_squared, sum, dot) give the same bits
// whatever the OpenMP thread count, and l2_norm_squared_each those of l2_norm_squared one by one;
// all_finite finds a NaN or Inf at any position of any float dtype (a bit test, so a large finite
// double stays finite); AdamW writes the bf16/fp16 model weights in its own pass exactly as a
// separate cast would, and its results do not depend on the thread count; AdamW with the
// clipping scale in its pass gives the bits of the scale pass followed by AdamW (and the
// double-precision formula), leaving the gradient as it was; dropout at probability 0 leaves an
// in-place tensor alone.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/fused_optim.h"
#include "kernels/ops.h"

namespace megatron::ops {
namespace {
using testing::randn;

// Runs f with 1, 2 and 3 OpenMP threads (the caller's count restored) and returns the results.
template <class F>
auto with_threads(F&& f) {
  const int saved = omp_get_max_threads();
  std::vector<decltype(f())> out;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    out.push_back(f());
  }
  omp_set_num_threads(saved);
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(StepKernels, SumsDoNotDependOnTheThreadCount) {
  const Tensor x = randn({1000003}, 1), y = randn({1000003}, 2);
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    const Tensor xd = x.to(dt);
    for (const auto& [name, fn] : std::vector<std::pair<std::string, std::function<double()>>>{
             {"l2_norm_squared", [&] { return l2_norm_squared(xd); }},
             {"sum", [&] { return sum(xd); }},
             {"dot", [&] { return dot(xd, y); }}}) {
      const std::vector<double> r = with_threads(fn);
      EXPECT_EQ(r[0], r[1]) << name << " " << dtype_name(dt);
      EXPECT_EQ(r[0], r[2]) << name << " " << dtype_name(dt);
    }
  }
  // And the sum of squares is the double-precision one.
  double ref = 0;
  for (float v : x.to_float_vector()) ref += double(v) * double(v);
  EXPECT_NEAR(l2_norm_squared(x), ref, 1e-12 * ref);
}

// The optimizer reads every gradient's sum of squares at once (one device read-back a step); on
// the CPU each value is that of l2_norm_squared alone, bit for bit, so the norm did not change.
TEST(StepKernels, SumsOfSquaresOfEachTensorAreTheOneTensorSums) {
  const Tensor big = randn({300007}, 4);
  const std::vector<Tensor> xs = {randn({0}, 5), randn({7}, 6), big, big.narrow(0, 11, 200000),
                                  randn({4097}, 7).to(DType::BF16), randn({65536}, 8)};
  const std::vector<double> each = l2_norm_squared_each(xs);
  ASSERT_EQ(each.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(each[i], l2_norm_squared(xs[i])) << i;
  EXPECT_TRUE(l2_norm_squared_each({}).empty());
}

TEST(StepKernels, AllFiniteFindsNaNAndInfAnywhereInEveryDtype) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (int64_t n : {int64_t(5), int64_t(300001)})
      for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity()})
        for (int64_t at : {int64_t(0), n / 2, n - 1}) {
          Tensor x = randn({n}, 3).to(dt);
          EXPECT_TRUE(all_finite(x));
          Tensor one = Tensor::full({1}, bad, dt);
          x.narrow(0, at, 1).copy_(one);
          EXPECT_FALSE(all_finite(x)) << dtype_name(dt) << " n " << n << " " << bad << " at " << at;
        }
  // Finite values stay finite at the top of each range (a test of bits, not of a float conversion).
  EXPECT_TRUE(all_finite(Tensor::full({9}, 1e300, DType::F64)));
  EXPECT_TRUE(all_finite(Tensor::full({9}, 65504.0, DType::F16)));
  EXPECT_TRUE(all_finite(Tensor::full({9}, 3.3e38, DType::BF16)));
}

TEST(StepKernels, AdamWWritesTheModelCopyInItsPassAsACastWould) {
  const int64_t n = 200003;
  const AdamWConfig cfg{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};
  for (DType dt : {DType::BF16, DType::F16}) {
    auto run = [&](bool fused) {
      Tensor p = randn({n}, 10), m = randn({n}, 11, 0.01f), v = randn({n}, 12, 0.01f);
      ops::scale(v, 0.0f);
      ops::add(v, v, Tensor::full({n}, 1e-4, DType::F32));
      Tensor copy = Tensor::zeros({n}, dt);
      adamw_step(p, randn({n}, 13, 0.1f), m, v, fused ? copy : Tensor(), cfg);
      if (!fused) cast(copy, p);
      return std::vector<Tensor>{p, m, v, copy};
    };
    const std::vector<Tensor> fused = run(true), separate = run(false);
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(same_bits(fused[i], separate[i])) << dtype_name(dt) << " output " << i;
    const std::vector<std::vector<Tensor>> by_threads = with_threads([&] { return run(true); });
    for (size_t t = 1; t < by_threads.size(); ++t)
      for (size_t i = 0; i < fused.size(); ++i)
        EXPECT_TRUE(same_bits(by_threads[t][i], by_threads[0][i])) << "output " << i;
  }
}

TEST(StepKernels, AdamWWithTheClippingScaleIsTheScalePassThenAdamW) {
  const int64_t n = 100003;
  const AdamWConfig cfg{2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4};
  const float clip = 0.3712f;
  const Tensor g0 = randn({n}, 23, 0.5f);
  std::vector<float> v0 = randn({n}, 22, 0.01f).to_float_vector();
  for (float& x : v0) x *= x;  // a second moment is not negative
  const std::vector<float> p0 = randn({n}, 20).to_float_vector(),
                           m0 = randn({n}, 21, 0.01f).to_float_vector(), g = g0.to_float_vector();
  for (DType dt : {DType::F32, DType::BF16}) {
    auto run = [&](bool fused) {
      Tensor p = randn({n}, 20), m = randn({n}, 21, 0.01f);
      Tensor v = Tensor::from_vector<float>(v0, {n}), g = g0.clone();
      Tensor copy = dt == DType::F32 ? Tensor() : Tensor::zeros({n}, dt);
      if (fused) {
        adamw_step_scaled(p, g, m, v, copy, cfg, clip);
      } else {
        scale(g, clip);
        adamw_step(p, g, m, v, copy, cfg);
      }
      return std::vector<Tensor>{p, m, v, dt == DType::F32 ? p : copy, g};
    };
    const std::vector<Tensor> fused = run(true), separate = run(false);
    for (size_t i = 0; i + 1 < fused.size(); ++i)
      EXPECT_TRUE(same_bits(fused[i], separate[i])) << dtype_name(dt) << " output " << i;
    EXPECT_TRUE(same_bits(fused[4], g0)) << "the gradient is left as it was";
    // The update in double precision from the same inputs.
    const std::vector<float> pf = fused[0].to_float_vector();
    const double bc1 = 1 - std::pow(0.9, 4), bc2 = 1 - std::pow(0.95, 4);
    for (int64_t i = 0; i < n; i += 97) {
      const double gi = double(g[size_t(i)]) * clip;
      const double mi = 0.9 * m0[size_t(i)] + 0.1 * gi, vi = 0.95 * v0[size_t(i)] + 0.05 * gi * gi;
      const double pi = p0[size_t(i)] - 2e-3 * ((mi / bc1) / (std::sqrt(vi / bc2) + 1e-8) +
                                                0.1 * p0[size_t(i)]);
      EXPECT_NEAR(pf[size_t(i)], pi, 2e-6 * (1 + std::abs(pi))) << i;
    }
  }
}

TEST(StepKernels, DropoutAtProbabilityZeroIsTheIdentity) {
  Tensor x = randn({70000}, 20);
  const Tensor before = x.clone();
  dropout_fwd(x, x, DropoutSpec{});
  dropout_bwd(x, x, DropoutSpec{});
  EXPECT_TRUE(same_bits(x, before));
  Tensor out = Tensor::zeros({70000}, DType::F32);
  dropout_fwd(out, x, DropoutSpec{});
  EXPECT_TRUE(same_bits(out, before));
}

}  // namespace
}  // namespace megatron::ops
