// The NCCL communicator on one GPU (a group of one over the self communicator: NCCL's own code
// path, rank 0 of 1): every collective on device tensors gives the group-of-one result, half
// precision included, host tensors go to the host communicator, split bootstraps a new group, and
// results are ordered before later kernels without a host wait. Needs a GPU and libnccl.so.2;
// skips and says so elsewhere (CI compiles it).
#include <gtest/gtest.h>

#include <vector>

#include "comm/nccl_communicator.h"
#include "kernels/ops.h"

#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace megatron {
namespace {

TEST(NcclCommunicator, GroupOfOneOnTheGpu) {
#ifndef MEGATRON_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  if (!nccl_compiled()) GTEST_SKIP() << "this build has no NCCL support (nccl.h not found)";
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device on this machine";
  cuda::init(0);
  const Device gpu = Device::cuda(0);
  auto comm = make_nccl_communicator(make_self_communicator("world"), gpu);
  ASSERT_EQ(comm->size(), 1);
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 1e-3f};
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = Tensor::from_vector(v, {4}).to(dt).to(gpu);
    comm->all_reduce(t, ReduceOp::Sum);
    Tensor want = Tensor::from_vector(v, {4}).to(dt).to(DType::F32);
    EXPECT_EQ(t.to(Device::cpu()).to(DType::F32).to_float_vector(), want.to_float_vector());
  }
  Tensor in = Tensor::from_vector(v, {4}, gpu), out = Tensor::zeros({4}, DType::F32, gpu);
  comm->all_gather(in, out);
  EXPECT_EQ(out.to(Device::cpu()).to_float_vector(), v);
  Tensor rs = Tensor::zeros({4}, DType::F32, gpu);
  comm->reduce_scatter(in, rs, ReduceOp::Max);
  EXPECT_EQ(rs.to(Device::cpu()).to_float_vector(), v);
  comm->broadcast(in, 0);
  Tensor buf = Tensor::from_vector(v, {4}, gpu);
  comm->all_gather_inplace(buf);
  EXPECT_EQ(buf.to(Device::cpu()).to_float_vector(), v);
  // A later kernel on the backend's stream sees the reduction (wait() orders, not blocks).
  Tensor x = Tensor::from_vector(v, {4}, gpu);
  CommHandle h = comm->all_reduce_async(x, ReduceOp::Sum);
  h.wait();
  ops::scale(x, 2.0f);
  EXPECT_EQ(x.to(Device::cpu()).to_float_vector(), (std::vector<float>{3.0f, -4.0f, 6.5f, 2e-3f}));
  // Host tensors go to the host communicator.
  Tensor host = Tensor::from_vector(v, {4});
  comm->all_reduce(host, ReduceOp::Sum);
  EXPECT_EQ(host.to_float_vector(), v);
  auto sub = comm->split(0, 0, "sub");
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->name(), "sub");
  Tensor y = Tensor::from_vector(v, {4}, gpu);
  sub->all_reduce(y, ReduceOp::Min);
  EXPECT_EQ(y.to(Device::cpu()).to_float_vector(), v);
  EXPECT_EQ(comm->split(-1, 0, "none"), nullptr);
#endif
}

}  // namespace
}  // namespace megatron
