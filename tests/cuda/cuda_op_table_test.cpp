// The CUDA backend's op table is complete: every op of MG_FOR_EACH_OP has a CUDA kernel. This
// needs no GPU (the table is built at compile time whenever the CUDA compiler was found, as in CI);
// the kernels' values are checked against the CPU by tests/kernels/backend_ops_test.cpp on a GPU.
// The norm and activation kinds need no test here: norm.cu and activation.cu instantiate a kernel
// for every kind of kernels/op_kinds.h, so a kind without one does not compile.
#include <gtest/gtest.h>

#include <string>

#include "kernels/backend.h"

#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace megatron {
namespace {

TEST(CudaOpTable, EveryOpHasACudaKernel) {
#ifndef MEGATRON_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (no CUDA compiler at configure time)";
#else
  const ops::OpTable& table = cuda::op_table();
  std::string missing;
  int ops = 0;
#define MG_MISSING_ENTRY(name) \
  ++ops;                       \
  if (table.name == nullptr) missing += " " #name;
  MG_FOR_EACH_OP(MG_MISSING_ENTRY)
#undef MG_MISSING_ENTRY
  EXPECT_TRUE(missing.empty()) << "ops of kernels/backend.h without a CUDA kernel in "
                                  "src/kernels/cuda/cuda_ops.cpp:"
                               << missing;
  EXPECT_GT(ops, 0);
#endif
}

}  // namespace
}  // namespace megatron
