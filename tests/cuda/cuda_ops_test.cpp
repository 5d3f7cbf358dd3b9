// Every CUDA op against its CPU twin (src/kernels/ops.h) on fresh random inputs. These run on the
// device machine; where the build has no CUDA backend or the machine has no GPU they skip and say
// why (CI compiles them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/ops.h"

#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"

namespace megatron {
namespace {

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device on this machine";
    cuda::init(0);
  }
};

const Device kGpu = Device::cuda(0);

Tensor randn(const Shape& shape, uint64_t stream, float stddev = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  Philox(77, stream).fill_normal(t.data<float>(), t.numel(), 0.0f, stddev);
  return t;
}

Tensor ids_tensor(int64_t n, int64_t vocab, uint64_t stream) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  Philox r(78, stream);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(r.u32(uint64_t(i)) % uint32_t(vocab));
  return Tensor::from_vector(v, {n});
}

Tensor gpu(const Tensor& t) { return t.to(kGpu); }
Tensor host(const Tensor& t) {
  cuda::synchronize();
  return t.to(Device::cpu());
}

// |got - want| <= atol + rtol |want| everywhere.
void expect_close(const char* what, const Tensor& got_gpu, const Tensor& want, double atol,
                  double rtol = 1e-5) {
  const std::vector<float> g = host(got_gpu).to_float_vector(), w = want.to_float_vector();
  ASSERT_EQ(g.size(), w.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(double(g[i]) - w[i]) <= atol + rtol * std::abs(double(w[i])))) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " off; first at " << first
                    << ": got " << (first >= 0 ? g[size_t(first)] : 0.f) << " want "
                    << (first >= 0 ? w[size_t(first)] : 0.f);
}

TEST_F(CudaOps, CopiesRoundTripAndAllocatorReusesBlocks) {
  Tensor a = randn({1000, 37}, 1);
  Tensor back = host(gpu(a));
  EXPECT_EQ(0, std::memcmp(a.raw_data(), back.raw_data(), a.nbytes()));
  Tensor z = Tensor::zeros({5, 7}, DType::BF16, kGpu);
  for (float v : host(z).to_float_vector()) EXPECT_EQ(v, 0.0f);
  { Tensor warm = Tensor::empty({1 << 20}, DType::F32, kGpu); }
  const auto before = cuda::allocator_stats();
  for (int i = 0; i < 10; ++i) Tensor t = Tensor::empty({1 << 20}, DType::F32, kGpu);
  EXPECT_EQ(cuda::allocator_stats().device_mallocs, before.device_mallocs)
      << "repeated allocations of one size must come from the cache";
}

TEST_F(CudaOps, GemmAllTransposesAndBatched) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t M = 67, K = 129, N = 45;
      Tensor a = ta ? randn({K, M}, 2) : randn({M, K}, 2);
      Tensor b = tb ? randn({N, K}, 3) : randn({K, N}, 3);
      Tensor c = randn({M, N}, 4);
      Tensor cg = gpu(c);
      ops::gemm(a, ta, b, tb, c, 0.5f, 0.25f);
      cuda::gemm(gpu(a), ta, gpu(b), tb, cg, 0.5f, 0.25f);
      expect_close("gemm", cg, c, 1e-4, 1e-4);
    }
  Tensor a = randn({3, 16, 32}, 5), b = randn({3, 32, 24}, 6), c = Tensor::zeros({3, 16, 24}, DType::F32);
  Tensor cg = gpu(c);
  ops::gemm_batched(a, false, b, false, c);
  cuda::gemm_batched(gpu(a), false, gpu(b), false, cg);
  expect_close("gemm_batched", cg, c, 1e-4, 1e-4);
}

TEST_F(CudaOps, ElementwiseGeluBiasAddScale) {
  Tensor x = randn({33, 130}, 7), dout = randn({33, 130}, 8), bias = randn({130}, 9);
  for (bool tanh_approx : {true, false}) {
    Tensor y = Tensor::empty(x.shape(), DType::F32), yg = Tensor::empty(x.shape(), DType::F32, kGpu);
    ops::gelu_fwd(y, x, tanh_approx);
    cuda::gelu_fwd(yg, gpu(x), tanh_approx);
    expect_close("gelu_fwd", yg, y, 1e-6);
    Tensor dx = Tensor::empty(x.shape(), DType::F32), dxg = Tensor::empty(x.shape(), DType::F32, kGpu);
    ops::gelu_bwd(dx, dout, x, tanh_approx);
    cuda::gelu_bwd(dxg, gpu(dout), gpu(x), tanh_approx);
    expect_close("gelu_bwd", dxg, dx, 1e-5);
  }
  Tensor xc = x.clone(), xg = gpu(x);
  ops::bias_add(xc, bias);
  cuda::bias_add(xg, gpu(bias));
  expect_close("bias_add", xg, xc, 1e-6);
  Tensor db = Tensor::zeros({130}, DType::F32), dbg = Tensor::zeros({130}, DType::F32, kGpu);
  ops::bias_grad(db, dout);
  cuda::bias_grad(dbg, gpu(dout));
  expect_close("bias_grad", dbg, db, 1e-5);
  Tensor s = Tensor::empty(x.shape(), DType::F32), sg = Tensor::empty(x.shape(), DType::F32, kGpu);
  ops::add(s, x, dout);
  cuda::add(sg, gpu(x), gpu(dout));
  ops::scale(s, 0.3f);
  cuda::scale(sg, 0.3f);
  expect_close("add+scale", sg, s, 1e-6);
}

TEST_F(CudaOps, DropoutMasksEqualTheCpuMasks) {
  Tensor x = randn({17, 300}, 10), bias = randn({300}, 11), res = randn({17, 300}, 12);
  ops::DropoutSpec d{0.3f, 1234, 99, 1000};
  Tensor y = Tensor::empty(x.shape(), DType::F32), yg = Tensor::empty(x.shape(), DType::F32, kGpu);
  ops::bias_dropout_add_fwd(y, x, bias, res, d);
  cuda::bias_dropout_add_fwd(yg, gpu(x), gpu(bias), gpu(res), d);
  expect_close("bias_dropout_add_fwd", yg, y, 1e-6);
  Tensor dx = Tensor::empty(x.shape(), DType::F32), dxg = Tensor::empty(x.shape(), DType::F32, kGpu);
  Tensor db = Tensor::zeros({300}, DType::F32), dbg = Tensor::zeros({300}, DType::F32, kGpu);
  ops::bias_dropout_add_bwd(dx, db, res, d);
  cuda::bias_dropout_add_bwd(dxg, dbg, gpu(res), d);
  expect_close("bias_dropout_add_bwd dx", dxg, dx, 1e-6);
  expect_close("bias_dropout_add_bwd dbias", dbg, db, 1e-5);
}

TEST_F(CudaOps, CastsRoundToNearestEven) {
  Tensor x = randn({4097}, 13, 100.0f);
  for (DType t : {DType::BF16, DType::F16}) {
    Tensor h = Tensor::empty(x.shape(), t), hg = Tensor::empty(x.shape(), t, kGpu);
    ops::cast(h, x);
    cuda::cast(hg, gpu(x));
    Tensor back = host(hg);
    EXPECT_EQ(0, std::memcmp(back.raw_data(), h.raw_data(), h.nbytes())) << dtype_name(t);
    Tensor f = Tensor::empty(x.shape(), DType::F32), fg = Tensor::empty(x.shape(), DType::F32, kGpu);
    ops::cast(f, h);
    cuda::cast(fg, hg);
    expect_close("cast back", fg, f, 0.0, 0.0);
  }
}

TEST_F(CudaOps, LayerNormForwardBackward) {
  const int64_t n = 130, h = 1000;
  Tensor x = randn({n, h}, 14), w = randn({h}, 15), b = randn({h}, 16), dout = randn({n, h}, 17);
  Tensor y = Tensor::empty({n, h}, DType::F32), mean = Tensor::empty({n}, DType::F32),
         rstd = Tensor::empty({n}, DType::F32);
  Tensor yg = Tensor::empty({n, h}, DType::F32, kGpu), meang = Tensor::empty({n}, DType::F32, kGpu),
         rstdg = Tensor::empty({n}, DType::F32, kGpu);
  ops::layernorm_fwd(y, mean, rstd, x, w, b, 1e-5f);
  Tensor xg = gpu(x), wg = gpu(w);
  cuda::layernorm_fwd(yg, meang, rstdg, xg, wg, gpu(b), 1e-5f);
  expect_close("layernorm y", yg, y, 1e-5, 1e-5);
  expect_close("layernorm rstd", rstdg, rstd, 1e-6, 1e-5);
  for (bool acc : {false, true}) {
    Tensor dx = randn({n, h}, 18), dw = randn({h}, 19), db = randn({h}, 20);
    Tensor dxg = gpu(dx), dwg = gpu(dw), dbg = gpu(db);
    ops::layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, acc);
    cuda::layernorm_bwd(dxg, dwg, dbg, gpu(dout), xg, wg, meang, rstdg, acc);
    expect_close("layernorm dx", dxg, dx, 1e-4, 1e-4);
    expect_close("layernorm dw", dwg, dw, 1e-3, 1e-4);
    expect_close("layernorm db", dbg, db, 1e-3, 1e-4);
  }
}

TEST_F(CudaOps, EmbeddingForwardBackwardDeterministic) {
  const int64_t V = 500, h = 96, n = 3000;
  Tensor w = randn({V, h}, 21), ids = ids_tensor(n, 40, 22), dout = randn({n, h}, 23);
  Tensor y = Tensor::empty({n, h}, DType::F32), yg = Tensor::empty({n, h}, DType::F32, kGpu);
  ops::embedding_fwd(y, ids, w);
  cuda::embedding_fwd(yg, gpu(ids), gpu(w));
  expect_close("embedding_fwd", yg, y, 0.0, 0.0);
  Tensor dw = Tensor::zeros({V, h}, DType::F32), dwg = Tensor::zeros({V, h}, DType::F32, kGpu);
  ops::embedding_bwd(dw, ids, dout);
  cuda::embedding_bwd(dwg, gpu(ids), gpu(dout));
  // Same summation order as the CPU op: bit-identical.
  expect_close("embedding_bwd", dwg, dw, 0.0, 0.0);
}

TEST_F(CudaOps, SoftmaxCrossEntropyForwardBackward) {
  const int64_t n = 37, V = 50304;
  Tensor logits = randn({n, V}, 24, 3.0f), labels = ids_tensor(n, V, 25);
  Tensor mask = Tensor::full({n}, 1.0, DType::F32);
  mask.data<float>()[3] = 0.0f;
  Tensor lg = gpu(logits), loss = Tensor::empty({n}, DType::F32),
         lossg = Tensor::empty({n}, DType::F32, kGpu);
  ops::softmax_xent_fwd_bwd(logits, loss, labels, mask, 0.125f, true);
  cuda::softmax_xent_fwd_bwd(lg, lossg, gpu(labels), gpu(mask), 0.125f, true);
  expect_close("xent loss", lossg, loss, 1e-5, 1e-5);
  expect_close("xent grad", lg, logits, 1e-7, 1e-4);
}

TEST_F(CudaOps, AdamWMultiTensorNormsAndFiniteCheck) {
  std::vector<Tensor> master, grad, m, v, copy;
  std::vector<cuda::AdamWTensors> dev;
  const int64_t sizes[] = {1, 1000, 70000, 200001};
  for (int i = 0; i < 4; ++i) {
    master.push_back(randn({sizes[i]}, 30 + i));
    grad.push_back(randn({sizes[i]}, 40 + i, 0.01f));
    m.push_back(randn({sizes[i]}, 50 + i, 0.001f));
    Tensor vv = randn({sizes[i]}, 60 + i, 0.001f);
    for (int64_t k = 0; k < vv.numel(); ++k) vv.data<float>()[k] *= vv.data<float>()[k];
    v.push_back(vv);
    copy.push_back(Tensor::empty({sizes[i]}, DType::BF16));
    dev.push_back({gpu(master[i]), gpu(grad[i]), gpu(m[i]), gpu(v[i]),
                   Tensor::empty({sizes[i]}, DType::BF16, kGpu)});
  }
  ops::AdamWConfig cfg{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  for (int i = 0; i < 4; ++i) ops::adamw_step(master[i], grad[i], m[i], v[i], copy[i], cfg);
  cuda::adamw_multi_tensor(dev, cfg);
  for (int i = 0; i < 4; ++i) {
    expect_close("adamw master", dev[i].master, master[i], 1e-7, 1e-6);
    expect_close("adamw exp_avg", dev[i].exp_avg, m[i], 1e-9, 1e-6);
    expect_close("adamw exp_avg_sq", dev[i].exp_avg_sq, v[i], 1e-12, 1e-6);
    expect_close("adamw bf16 copy", dev[i].model_copy, copy[i], 0.0, 1e-2);
  }
  std::vector<Tensor> gg;
  double want = 0;
  for (int i = 0; i < 4; ++i) {
    gg.push_back(dev[i].grad);
    want += ops::l2_norm_squared(grad[i]);
  }
  EXPECT_NEAR(cuda::l2_norm_squared(gg), want, 1e-9 * want);
  EXPECT_TRUE(cuda::all_finite(gg));
  cuda::scale_all(gg, 2.0f);
  EXPECT_NEAR(cuda::l2_norm_squared(gg), 4 * want, 4e-9 * want);
  Tensor bad = grad[2].clone();
  bad.data<float>()[12345] = NAN;
  gg[2] = gpu(bad);
  EXPECT_FALSE(cuda::all_finite(gg));
}

}  // namespace
}  // namespace megatron

#else

TEST(CudaOps, NotCompiled) {
  GTEST_SKIP() << "this build has no CUDA backend (no CUDA compiler at configure time)";
}

#endif
