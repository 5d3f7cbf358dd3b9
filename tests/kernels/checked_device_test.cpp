// The op dispatch and the checking device: ops refuse tensors of mixed devices and ops a backend
// has no kernel for, naming both; tensors on the checking device cannot be read or written by
// host code (data() throws, a raw pointer faults) but work through ops and explicit copies, and
// every op leaves their memory closed again, also when it throws.
#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>

#include "core/safetensors.h"
#include "kernels/backend.h"
#include "kernels/checked/checked_backend.h"
#include "test_util.h"

namespace megatron {
namespace {

using megatron::testing::checked_device;
using megatron::testing::error_of;

std::vector<float> iota(int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float(i) - 3.0f;
  return v;
}

TEST(CheckedDevice, HostCodeCannotReadTensorsOutsideOps) {
  const Tensor t = Tensor::zeros({4, 5}, DType::F32, checked_device());
  try {
    (void)t.data<float>();
    FAIL() << "data() on the checking device outside an op must throw";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 5] float32 on checked:0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("outside an op"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)t.narrow(0, 1, 2).raw_data(), InternalError);
}

TEST(CheckedDevice, RawPointerAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor t = Tensor::zeros({1024}, DType::F32, checked_device());
  float* p = static_cast<float*>(t.storage()->data());
  EXPECT_DEATH({ p[7] = 1.0f; }, "");
}

TEST(CheckedDevice, ExplicitCopiesWork) {
  const Device dev = checked_device();
  const Tensor host = Tensor::from_vector(iota(24), {4, 6});
  const Tensor t = Tensor::from_vector(iota(24), {4, 6}, dev);
  EXPECT_EQ(t.device(), dev);
  EXPECT_EQ(t.to(Device::cpu()).to_float_vector(), host.to_float_vector());
  EXPECT_EQ(t.to_float_vector(), host.to_float_vector());
  EXPECT_EQ(t.item_as_double(7), host.item_as_double(7));
  EXPECT_EQ(t.transpose(0, 1).item_as_double(7), host.transpose(0, 1).item_as_double(7));
  // Strided and converting copies on the device, and across devices.
  Tensor block = Tensor::zeros({4, 2}, DType::BF16, dev);
  block.copy_(t.narrow(1, 3, 2));
  EXPECT_EQ(block.to_float_vector(), host.narrow(1, 3, 2).to(DType::BF16).to_float_vector());
  Tensor back = Tensor::full({4, 6}, 9.0, DType::F32);
  back.narrow(1, 0, 2).copy_(block);
  EXPECT_EQ(back.item_as_double(6), host.item_as_double(9));
  EXPECT_EQ(back.item_as_double(8), 9.0);
  const Tensor c = t.clone();
  EXPECT_EQ(c.device(), dev);
  EXPECT_NE(c.storage(), t.storage());
  Tensor f = Tensor::empty({3}, DType::I32, dev);
  f.fill_(5);
  EXPECT_EQ(f.to_float_vector(), (std::vector<float>{5, 5, 5}));
  f.zero_();
  EXPECT_EQ(f.to_float_vector(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(t.storage()->host_access_count(), 0);
}

TEST(CheckedDevice, OpsComputeAndCloseTheirTensorsAgain) {
  const Device dev = checked_device();
  const Tensor a = Tensor::from_vector(iota(10), {10}, dev), b = Tensor::from_vector(iota(10, 2), {10}, dev);
  Tensor out = Tensor::empty({10}, DType::F32, dev);
  ops::add(out, a, b);
  EXPECT_EQ(out.to_float_vector()[4], (4.0f - 3.0f) + (8.0f - 3.0f));
  EXPECT_DOUBLE_EQ(ops::sum(a), 45.0 - 30.0);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &out}) EXPECT_EQ(t->storage()->host_access_count(), 0);
  EXPECT_THROW((void)out.data<float>(), InternalError);
  // An op that throws (an id outside the table) closes its tensors too.
  const Tensor weight = Tensor::zeros({5, 3}, DType::F32, dev);
  const Tensor ids = Tensor::from_vector(std::vector<int32_t>{1, 7}, {2}, dev);
  Tensor emb = Tensor::empty({2, 3}, DType::F32, dev);
  EXPECT_NE(error_of([&] { ops::embedding_fwd(emb, ids, weight); }).find("embedding index 7"),
            std::string::npos);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&weight, &ids, &emb}) EXPECT_EQ(t->storage()->host_access_count(), 0);
}

TEST(CheckedDevice, SafetensorsWritesFromAHostCopy) {
  megatron::testing::TempDir dir;
  const Tensor t = Tensor::from_vector(iota(6), {2, 3}, checked_device());
  write_safetensors(dir / "t.safetensors", {{"t", t}}, {});
  const SafetensorsContents back = read_safetensors(dir / "t.safetensors");
  EXPECT_EQ(back.tensors.at("t").to_float_vector(), iota(6));
}

TEST(Dispatch, MixedDevicesThrowNamingTheOpAndTheDevices) {
  const Tensor a = Tensor::zeros({4}, DType::F32, checked_device());
  const Tensor b = Tensor::zeros({4}, DType::F32);
  const std::string msg = error_of([&] { ops::add(b, b, a); });
  EXPECT_NE(msg.find("add: tensors on cpu and checked:0"), std::string::npos) << msg;
}

TEST(Dispatch, AnOpWithoutAKernelThrowsNamingTheOpAndTheDevice) {
  const Device dev = checked_device();
  ops::OpTable partial = ops::checked_op_table();
  partial.gemm = nullptr;
  ops::register_backend(DeviceType::Checked, &partial);
  const Tensor m = Tensor::zeros({2, 2}, DType::F32, dev);
  const std::string no_kernel = error_of([&] { ops::gemm(m, false, m, false, m); });
  ops::register_backend(DeviceType::Checked, nullptr);
  const std::string no_backend = error_of([&] { ops::scale(m, 2.0f); });
  ops::register_backend(DeviceType::Checked, &ops::checked_op_table());
  EXPECT_NE(no_kernel.find("gemm has no kernel on checked:0"), std::string::npos) << no_kernel;
  EXPECT_NE(no_backend.find("scale: no backend for checked:0"), std::string::npos) << no_backend;
  EXPECT_NO_THROW(ops::gemm(m, false, m, false, m));
}

}  // namespace
}  // namespace megatron
