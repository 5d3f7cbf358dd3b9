// RMSNorm, SwiGLU and squared ReLU against double-precision references written here: forwards
// from the formulas, backwards by central differences of the double forward (so the checks do
// not share the kernels' backward formulas). Odd widths, one row, aliasing where allowed and
// argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;
using testing::to_double;

// d(sum_k f(x)_k * g_k)/dx by central differences of a double function f.
std::vector<double> numeric_grad(const std::function<std::vector<double>(const std::vector<double>&)>& f,
                                 std::vector<double> x, const std::vector<double>& g) {
  std::vector<double> out(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const double h = 1e-6, orig = x[k];
    x[k] = orig + h;
    const std::vector<double> up = f(x);
    x[k] = orig - h;
    const std::vector<double> dn = f(x);
    x[k] = orig;
    double s = 0;
    for (size_t e = 0; e < up.size(); ++e) s += (up[e] - dn[e]) * g[e];
    out[k] = s / (2 * h);
  }
  return out;
}

std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                                int64_t n, int64_t h, double eps, std::vector<double>* rstd) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += x[size_t(i * h + j)] * x[size_t(i * h + j)];
    const double r = 1.0 / std::sqrt(ms / double(h) + eps);
    if (rstd) rstd->push_back(r);
    for (int64_t j = 0; j < h; ++j) y[size_t(i * h + j)] = x[size_t(i * h + j)] * r * w[size_t(j)];
  }
  return y;
}

void rmsnorm_case(int64_t n, int64_t h) {
  SCOPED_TRACE("rmsnorm n=" + std::to_string(n) + " h=" + std::to_string(h));
  const float eps = 1e-5f;
  Tensor x = randn({n, h}, 101, 2.0f), w = randn({h}, 102), g = randn({n, h}, 103);
  const std::vector<double> xd = to_double(x), wd = to_double(w), gd = to_double(g);
  std::vector<double> rstd_ref;
  const std::vector<double> yref = rmsnorm_ref(xd, wd, n, h, eps, &rstd_ref);
  Tensor y = Tensor::empty({n, h}, DType::F32), rstd = Tensor::empty({n}, DType::F32);
  norm_fwd(NormId::rmsnorm, y, Tensor(), rstd, x, w, Tensor(), eps);
  expect_close("rmsnorm_fwd", y, yref, 1e-5);
  expect_close("rmsnorm rstd", rstd, rstd_ref, 1e-6);
  // Nothing saved: same output.
  Tensor y2 = Tensor::empty({n, h}, DType::F32);
  norm_fwd(NormId::rmsnorm, y2, Tensor(), Tensor(), x, w, Tensor(), eps);
  EXPECT_EQ(y2.to_float_vector(), y.to_float_vector());
  const std::vector<double> dx_ref = numeric_grad(
      [&](const std::vector<double>& xv) { return rmsnorm_ref(xv, wd, n, h, eps, nullptr); }, xd, gd);
  const std::vector<double> dw_ref = numeric_grad(
      [&](const std::vector<double>& wv) { return rmsnorm_ref(xd, wv, n, h, eps, nullptr); }, wd, gd);
  Tensor dx = Tensor::full({n, h}, 7.0, DType::F32), dw = Tensor::full({h}, 0.5, DType::F32);
  norm_bwd(NormId::rmsnorm, dx, dw, Tensor(), g, x, w, Tensor(), rstd);
  expect_close("rmsnorm_bwd dx", dx, dx_ref, 2e-5, 1e-4);
  std::vector<double> dw_acc = dw_ref;
  for (double& v : dw_acc) v += 0.5;  // dweight accumulates
  expect_close("rmsnorm_bwd dweight", dw, dw_acc, 2e-5, 1e-4);
  // accumulate_dx adds onto dx.
  Tensor dx_acc = Tensor::full({n, h}, 1.0, DType::F32), dw2 = Tensor::zeros({h}, DType::F32);
  norm_bwd(NormId::rmsnorm, dx_acc, dw2, Tensor(), g, x, w, Tensor(), rstd, true);
  std::vector<double> dx_plus = dx_ref;
  for (double& v : dx_plus) v += 1.0;
  expect_close("rmsnorm_bwd accumulate", dx_acc, dx_plus, 2e-5, 1e-4);
  // out may alias x; dx may alias dout.
  Tensor xa = x.clone();
  norm_fwd(NormId::rmsnorm, xa, Tensor(), Tensor(), xa, w, Tensor(), eps);
  EXPECT_EQ(xa.to_float_vector(), y.to_float_vector());
  Tensor ga = g.clone(), dw3 = Tensor::zeros({h}, DType::F32);
  norm_bwd(NormId::rmsnorm, ga, dw3, Tensor(), ga, x, w, Tensor(), rstd);
  expect_close("rmsnorm_bwd dx aliasing dout", ga, dx_ref, 2e-5, 1e-4);
}

TEST(NormActivation, RmsNormForwardBackward) {
  rmsnorm_case(13, 24);
  rmsnorm_case(1, 7);  // one row, odd width
  rmsnorm_case(5, 33);
}

TEST(NormActivation, RmsNormRejectsBadArguments) {
  Tensor x = randn({4, 6}, 1), w = randn({5}, 2), out = Tensor::empty({4, 6}, DType::F32);
  EXPECT_THROW(norm_fwd(NormId::rmsnorm, out, Tensor(), Tensor(), x, w, Tensor(), 1e-5f),
               InternalError);  // weight width
  EXPECT_THROW(norm_fwd(NormId::rmsnorm, out, Tensor(), Tensor::empty({3}, DType::F32), x,
                        randn({6}, 3), Tensor(), 1e-5f),
               InternalError);  // rstd rows
  EXPECT_THROW(norm_fwd(NormId::rmsnorm, out, Tensor(), Tensor(), x.to(DType::BF16), randn({6}, 3),
                        Tensor(), 1e-5f),
               InternalError);
  Tensor r = Tensor::empty({4}, DType::F32), dw = Tensor::zeros({6}, DType::F32);
  EXPECT_THROW(
      norm_bwd(NormId::rmsnorm, out, dw, Tensor(), out, x, randn({6}, 3), Tensor(), r, true),
      InternalError);  // alias + acc
}

TEST(NormActivation, LayerNormWithoutSavedStatistics) {
  Tensor x = randn({3, 10}, 4), w = randn({10}, 5), b = randn({10}, 6);
  Tensor y = Tensor::empty({3, 10}, DType::F32), y2 = Tensor::empty({3, 10}, DType::F32);
  Tensor mean = Tensor::empty({3}, DType::F32), rstd = Tensor::empty({3}, DType::F32);
  norm_fwd(NormId::layernorm, y, mean, rstd, x, w, b, 1e-5f);
  norm_fwd(NormId::layernorm, y2, Tensor(), Tensor(), x, w, b, 1e-5f);
  EXPECT_EQ(y2.to_float_vector(), y.to_float_vector());
}

std::vector<double> swiglu_ref(const std::vector<double>& x, int64_t n, int64_t f) {
  std::vector<double> y;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double a = x[size_t(i * 2 * f + j)], u = x[size_t(i * 2 * f + f + j)];
      y.push_back(a / (1.0 + std::exp(-a)) * u);
    }
  return y;
}

TEST(NormActivation, SwiGluForwardBackward) {
  for (auto [n, f] : {std::pair<int64_t, int64_t>{6, 11}, {1, 3}, {4, 40}}) {
    SCOPED_TRACE("swiglu n=" + std::to_string(n) + " f=" + std::to_string(f));
    Tensor x = randn({n, 2 * f}, 110, 3.0f), g = randn({n, f}, 111);
    const std::vector<double> xd = to_double(x);
    Tensor y = Tensor::empty({n, f}, DType::F32);
    activation_fwd(ActivationId::swiglu, y, x);
    expect_close("swiglu_fwd", y, swiglu_ref(xd, n, f), 1e-6, 1e-5);
    Tensor dx = Tensor::full({n, 2 * f}, 9.0, DType::F32);  // must be fully written
    activation_bwd(ActivationId::swiglu, dx, g, x);
    const std::vector<double> dref = numeric_grad(
        [&](const std::vector<double>& xv) { return swiglu_ref(xv, n, f); }, xd, to_double(g));
    expect_close("swiglu_bwd", dx, dref, 1e-5, 1e-4);
  }
  // Saturated gates stay finite.
  Tensor big = Tensor::from_vector(std::vector<float>{-200.0f, 200.0f, 2.0f, 3.0f}, {1, 4});
  Tensor yb = Tensor::empty({1, 2}, DType::F32), db = Tensor::empty({1, 4}, DType::F32);
  activation_fwd(ActivationId::swiglu, yb, big);
  activation_bwd(ActivationId::swiglu, db, Tensor::full({1, 2}, 1.0, DType::F32), big);
  expect_close("swiglu saturated", yb, {0.0, 600.0}, 1e-6, 1e-6);
  expect_close("swiglu saturated grad", db, {0.0, 3.0, 0.0, 200.0}, 1e-6, 1e-6);
  EXPECT_THROW(activation_fwd(ActivationId::swiglu, Tensor::empty({1, 3}, DType::F32), big),
               InternalError);
  EXPECT_THROW(activation_fwd(ActivationId::swiglu, yb, Tensor::empty({1, 5}, DType::F32)),
               InternalError);
  EXPECT_THROW(activation_bwd(ActivationId::swiglu, Tensor::empty({1, 2}, DType::F32), yb, big),
               InternalError);
}

TEST(NormActivation, SquaredReluForwardBackward) {
  const int64_t n = 1001;
  Tensor x = randn({n}, 120, 2.0f), g = randn({n}, 121);
  x.data<float>()[5] = 0.0f;
  std::vector<double> yref, dref;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x.item_as_double(i), r = v > 0 ? v : 0;
    yref.push_back(r * r);
    dref.push_back(g.item_as_double(i) * 2 * r);
  }
  Tensor y = Tensor::empty({n}, DType::F32);
  activation_fwd(ActivationId::squared_relu, y, x);
  expect_close("squared_relu_fwd", y, yref, 1e-6);
  // The derivative by central differences away from the kink.
  for (int64_t i : {int64_t(0), int64_t(17), int64_t(400)}) {
    const double v = x.item_as_double(i), h = 1e-6;
    if (std::abs(v) < 1e-3) continue;
    auto f = [](double u) { return u > 0 ? u * u : 0.0; };
    EXPECT_NEAR(dref[size_t(i)], g.item_as_double(i) * (f(v + h) - f(v - h)) / (2 * h), 1e-6);
  }
  Tensor dx = g.clone();  // dx may alias dout
  activation_bwd(ActivationId::squared_relu, dx, dx, x);
  expect_close("squared_relu_bwd", dx, dref, 1e-6);
  Tensor xa = x.clone();  // out may alias x
  activation_fwd(ActivationId::squared_relu, xa, xa);
  expect_close("squared_relu_fwd in place", xa, yref, 1e-6);
  EXPECT_THROW(activation_fwd(ActivationId::squared_relu, Tensor::empty({n - 1}, DType::F32), x),
               InternalError);
}

// A bf16 output (a norm or activation feeding bf16 products) is the fp32 output rounded as
// ops::cast rounds it, bit for bit, for every kind (a NaN included); other output dtypes are
// refused, and backward's dx stays fp32.
TEST(NormActivation, Bf16OutputsAreTheFp32OutputsCast) {
  auto expect_cast = [](const std::string& what, const Tensor& got, const Tensor& f32) {
    Tensor want = Tensor::empty(f32.shape(), DType::BF16);
    cast(want, f32);
    ASSERT_EQ(got.dtype(), DType::BF16) << what;
    const uint16_t *g = static_cast<const uint16_t*>(got.raw_data()),
                   *w = static_cast<const uint16_t*>(want.raw_data());
    for (int64_t i = 0; i < got.numel(); ++i)
      ASSERT_EQ(g[i], w[i]) << what << " element " << i;
  };
  for (const NormOp& k : kNormOps) {
    for (auto [n, h] : {std::pair<int64_t, int64_t>{7, 33}, {300, 128}}) {
      Tensor x = randn({n, h}, 130, 3.0f), w = randn({h}, 131);
      Tensor b = k.has_bias ? randn({h}, 132) : Tensor();
      Tensor y = Tensor::empty({n, h}, DType::F32), yb = Tensor::empty({n, h}, DType::BF16);
      Tensor r = Tensor::empty({n}, DType::F32), rb = Tensor::empty({n}, DType::F32);
      norm_fwd(k.id, y, Tensor(), r, x, w, b, 1e-5f);
      norm_fwd(k.id, yb, Tensor(), rb, x, w, b, 1e-5f);
      expect_cast(std::string(k.name) + " " + std::to_string(n) + " x " + std::to_string(h), yb, y);
      EXPECT_EQ(rb.to_float_vector(), r.to_float_vector()) << k.name;
    }
    Tensor x = randn({4, 8}, 133);
    EXPECT_THROW(norm_fwd(k.id, Tensor::empty({4, 8}, DType::F16), Tensor(), Tensor(), x,
                          randn({8}, 134), k.has_bias ? randn({8}, 135) : Tensor(), 1e-5f),
                 InternalError) << k.name << ": fp16 out";
  }
  for (const ActivationOp& k : kActivationOps) {
    const int64_t n = 37, f = 70, in = k.gated ? 2 * f : f;
    Tensor x = randn({n, in}, 136, 2.0f);
    x.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
    Tensor y = Tensor::empty({n, f}, DType::F32), yb = Tensor::empty({n, f}, DType::BF16);
    activation_fwd(k.id, y, x);
    activation_fwd(k.id, yb, x);
    expect_cast(k.name, yb, y);
    EXPECT_THROW(activation_bwd(k.id, Tensor::empty({n, in}, DType::BF16), randn({n, f}, 137), x),
                 InternalError) << k.name << ": bf16 dx";
    EXPECT_THROW(activation_fwd(k.id, Tensor::empty({n, f}, DType::F16), x), InternalError)
        << k.name << ": fp16 out";
  }
}

}  // namespace
}  // namespace megatron::ops
