// Every norm and activation kind of kernels/op_kinds.h through ops::norm_* / activation_*: each
// kind's backward against central differences of its own forward (so a kind added to the table
// is checked without a test of its own), and the errors of the kind-taking ops: a kind's shape
// (bias, gated width), an id outside the enum, a backend without the kind's kernel.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/backend.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;

// Central differences in fp32 with step h of sum(f(x) * g) per element of x: `f` writes f(x)
// for the current x. Returns the gradient for the elements [first, first + count) of x.
template <class F>
std::vector<double> numeric_grad(const Tensor& x, const Tensor& y, const Tensor& g, int64_t first,
                                 int64_t count, float h, F&& f) {
  std::vector<double> grad;
  float* xp = x.data<float>();
  auto loss = [&] {
    f();
    double s = 0;
    for (int64_t e = 0; e < y.numel(); ++e) s += double(y.data<float>()[e]) * g.item_as_double(e);
    return s;
  };
  for (int64_t k = first; k < first + count; ++k) {
    const float orig = xp[k];
    xp[k] = orig + h;
    const double up = loss();
    xp[k] = orig - h;
    const double dn = loss();
    xp[k] = orig;
    grad.push_back((up - dn) / (2.0 * double(h)));
  }
  return grad;
}

TEST(LayerKinds, EveryActivationsBackwardMatchesItsForward) {
  for (const ActivationOp& k : kActivationOps) {
    SCOPED_TRACE(k.name);
    const int64_t n = 3, f = 10, width = k.gated ? 2 * f : f;
    Tensor x = randn({n, width}, 300, 1.5f), g = randn({n, f}, 301);
    // Keep inputs away from 0, where some activations have a kink.
    for (int64_t e = 0; e < x.numel(); ++e)
      if (std::abs(x.data<float>()[e]) < 0.05f) x.data<float>()[e] = 0.3f;
    Tensor y = Tensor::empty({n, f}, DType::F32), dx = Tensor::full(x.shape(), 7.0, DType::F32);
    activation_bwd(k.id, dx, g, x);
    const std::vector<double> want = numeric_grad(x, y, g, 0, x.numel(), 1e-2f,
                                                  [&] { activation_fwd(k.id, y, x); });
    expect_close("dx", dx, want, 2e-3, 1e-2);
  }
}

TEST(LayerKinds, EveryNormsBackwardMatchesItsForward) {
  for (const NormOp& k : kNormOps) {
    SCOPED_TRACE(k.name);
    const int64_t n = 3, h = 9;
    Tensor x = randn({n, h}, 310, 2.0f), w = randn({h}, 311), g = randn({n, h}, 312);
    Tensor b = k.has_bias ? randn({h}, 313) : Tensor();
    Tensor y = Tensor::empty({n, h}, DType::F32), rstd = Tensor::empty({n}, DType::F32);
    Tensor mean = k.saves_mean ? Tensor::empty({n}, DType::F32) : Tensor();
    auto fwd = [&] { norm_fwd(k.id, y, mean, rstd, x, w, b, 1e-5f); };
    fwd();
    Tensor dx = Tensor::empty({n, h}, DType::F32), dw = Tensor::zeros({h}, DType::F32);
    Tensor db = k.has_bias ? Tensor::zeros({h}, DType::F32) : Tensor();
    norm_bwd(k.id, dx, dw, db, g, x, w, mean, rstd);
    const Tensor xs = x.clone(), ws = w.clone();  // the statistics' inputs, for backward
    expect_close("dx", dx, numeric_grad(x, y, g, 0, x.numel(), 1e-2f, fwd), 3e-3, 1e-2);
    expect_close("dweight", dw, numeric_grad(w, y, g, 0, h, 1e-2f, fwd), 3e-3, 1e-2);
    if (k.has_bias) expect_close("dbias", db, numeric_grad(b, y, g, 0, h, 1e-2f, fwd), 3e-3, 1e-2);
    EXPECT_EQ(x.to_float_vector(), xs.to_float_vector());
    EXPECT_EQ(w.to_float_vector(), ws.to_float_vector());
  }
}

template <class F>
void expect_error_naming(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
                                           << "'" << p << "' not in: " << e.what();
  }
}

TEST(LayerKinds, KindTakingOpsRejectBadArguments) {
  Tensor x = randn({4, 6}, 1), w = randn({6}, 2), b = randn({6}, 3);
  Tensor out = Tensor::empty({4, 6}, DType::F32), rstd = Tensor::empty({4}, DType::F32);
  // A bias exactly when the kind has one; a saved mean only for kinds that keep it.
  EXPECT_THROW(norm_fwd(NormId::layernorm, out, Tensor(), rstd, x, w, Tensor(), 1e-5f),
               InternalError);
  EXPECT_THROW(norm_fwd(NormId::rmsnorm, out, Tensor(), rstd, x, w, b, 1e-5f), InternalError);
  EXPECT_THROW(norm_fwd(NormId::rmsnorm, out, Tensor::empty({4}, DType::F32), rstd, x, w,
                        Tensor(), 1e-5f),
               InternalError);
  // A gated kind's output is half of x's width; a plain kind's is x's shape.
  EXPECT_THROW(activation_fwd(ActivationId::swiglu, out, x), InternalError);
  EXPECT_THROW(activation_fwd(ActivationId::gelu, Tensor::empty({4, 3}, DType::F32), x),
               InternalError);
  // An id outside the enums.
  expect_error_naming([&] { activation_fwd(ActivationId(200), out, x); },
                      {"activation_fwd", "kind 200", "op_kinds.h"});
  expect_error_naming([&] { norm_bwd(NormId(9), out, w, Tensor(), out, x, w, Tensor(), rstd); },
                      {"norm_bwd", "kind 9"});
}

// What a backend without a kind's kernel (CUDA for RMSNorm, SwiGLU, squared ReLU) throws.
TEST(LayerKinds, MissingKindKernelNamesOpKindAndDevice) {
  expect_error_naming(
      [] { detail::throw_no_kind_kernel("activation_fwd", ActivationId::swiglu, Device::cuda(0)); },
      {"activation_fwd", "swiglu", "cuda:0", "not implemented on CUDA", "has no kernel on cuda"});
  expect_error_naming(
      [] { detail::throw_no_kind_kernel("norm_bwd", NormId::rmsnorm, Device::cuda(1)); },
      {"norm_bwd", "RMSNorm", "cuda:1", "not implemented on CUDA"});
}

}  // namespace
}  // namespace megatron::ops
