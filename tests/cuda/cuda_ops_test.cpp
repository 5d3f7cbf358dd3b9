// The CUDA backend's own pieces: host<->device copies, the caching allocator, and the
// multi-tensor optimizer kernels (several tensors per launch, which ops:: does not expose). Every
// op reached through ops:: is compared with the CPU in tests/kernels/backend_ops_test.cpp. These
// run on a GPU machine; where the build has no CUDA backend or the machine has no GPU they skip
// and say why (CI compiles them).
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

// Column blocks of wider matrices copy in one 2-D copy each way (Tensor::copy_ of row-strided
// tensors, as the tensor-parallel scatter does), and zero_ clears device memory in place.
TEST_F(CudaOps, RowStridedCopiesAndZero) {
  Tensor a = randn({9, 12}, 2);
  Tensor want = a.narrow(1, 3, 5).contiguous();
  Tensor dev = gpu(a);
  Tensor block = Tensor::empty({9, 5}, DType::F32, kGpu);
  block.copy_(dev.narrow(1, 3, 5));  // device -> device, strided source
  EXPECT_EQ(0, std::memcmp(host(block).raw_data(), want.raw_data(), want.nbytes()));
  Tensor back = Tensor::zeros({9, 12}, DType::F32);
  back.narrow(1, 3, 5).copy_(block);  // device -> host, strided destination
  EXPECT_EQ(back.narrow(1, 3, 5).contiguous().to_float_vector(), want.to_float_vector());
  EXPECT_EQ(back.narrow(1, 0, 3).contiguous().to_float_vector(), std::vector<float>(27, 0.0f));
  Tensor wide = Tensor::zeros({9, 12}, DType::F32, kGpu);
  wide.narrow(1, 7, 5).copy_(a.narrow(1, 3, 5));  // host -> device, both strided
  EXPECT_EQ(host(wide).narrow(1, 7, 5).contiguous().to_float_vector(), want.to_float_vector());
  dev.zero_();
  EXPECT_EQ(host(dev).to_float_vector(), std::vector<float>(108, 0.0f));
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
