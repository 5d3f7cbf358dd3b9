// Every op on every backend against the CPU (ggml's test-backend-ops): the cases of
// backend_op_cases.cpp run on the CPU (the reference), on the checking device (the same kernels
// over guarded memory: equal bit for bit) and on CUDA where a GPU is present (within each case's
// tolerances; an op without a CUDA kernel is listed, not failed). Also: every op has cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "backend_ops.h"
#include "kernels/backend.h"
#include "test_util.h"

#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace megatron::ops::testing {
namespace {

std::vector<Tensor> to_host(const std::vector<Tensor>& outs) {
  std::vector<Tensor> host;
  for (const Tensor& t : outs) host.push_back(t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()));
  return host;
}

std::string describe(const OpCase& c) { return c.op + " (" + c.what + ")"; }

// The case's outputs on `device`, copied to the host.
std::vector<Tensor> run_on(const OpCase& c, Device device) { return to_host(c.run(device)); }

TEST(BackendOps, EveryOpHasCasesAndEveryCaseNamesAnOp) {
  const std::set<std::string> ops = {
#define MG_OP_NAME(name) #name,
      MG_FOR_EACH_OP(MG_OP_NAME)
#undef MG_OP_NAME
  };
  std::set<std::string> covered;
  for (const OpCase& c : backend_op_cases()) {
    EXPECT_TRUE(ops.count(c.op)) << describe(c) << ": not an op of MG_FOR_EACH_OP";
    covered.insert(c.op);
  }
  for (const std::string& op : ops) EXPECT_TRUE(covered.count(op)) << op << " has no case";
}

// Every kind of kernels/op_kinds.h has forward and backward cases of its ops.
TEST(BackendOps, EveryNormAndActivationKindHasCases) {
  std::set<std::string> covered;  // "op kind"
  for (const OpCase& c : backend_op_cases())
    if (!c.kind.empty()) covered.insert(c.op + " " + c.kind);
  for (const NormOp& k : kNormOps)
    for (const char* op : {"norm_fwd", "norm_bwd"})
      EXPECT_TRUE(covered.count(op + std::string(" ") + k.name)) << op << " has no case for "
                                                                 << k.name;
  for (const ActivationOp& k : kActivationOps)
    for (const char* op : {"activation_fwd", "activation_bwd"})
      EXPECT_TRUE(covered.count(op + std::string(" ") + k.name)) << op << " has no case for "
                                                                 << k.name;
}

TEST(BackendOps, CpuCasesRunAndAreDeterministic) {
  for (const OpCase& c : backend_op_cases()) {
    SCOPED_TRACE(describe(c));
    const std::vector<Tensor> a = run_on(c, Device::cpu()), b = run_on(c, Device::cpu());
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(0, std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes())) << "output " << i;
  }
}

TEST(BackendOps, CheckedDeviceEqualsCpuBitForBit) {
  const Device checked = megatron::testing::checked_device();
  for (const OpCase& c : backend_op_cases()) {
    SCOPED_TRACE(describe(c));
    const std::vector<Tensor> want = run_on(c, Device::cpu()), got = run_on(c, checked);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
      ASSERT_EQ(got[i].dtype(), want[i].dtype()) << "output " << i;
      EXPECT_EQ(0, std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()))
          << "output " << i << " differs from the CPU's";
    }
  }
}

#ifdef MEGATRON_HAVE_CUDA
// Number of elements of got outside the tolerance of want (and the first of them).
int64_t count_off(const Tensor& got, const Tensor& want, Tolerance tol, int64_t* first) {
  const std::vector<float> g = got.to_float_vector(), w = want.to_float_vector();
  int64_t bad = 0;
  *first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const double gi = g[i], wi = w[i];
    if (gi == wi || std::abs(gi - wi) <= tol.atol + tol.rtol * std::abs(wi)) continue;
    if (*first < 0) *first = int64_t(i);
    ++bad;
  }
  return bad;
}
#endif

TEST(BackendOps, CudaMatchesCpu) {
#ifndef MEGATRON_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (no CUDA compiler at configure time)";
#else
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device on this machine";
  cuda::init(0);
  std::set<std::string> without_kernel;
  for (const OpCase& c : backend_op_cases()) {
    SCOPED_TRACE(describe(c));
    std::vector<Tensor> got;
    try {
      got = run_on(c, Device::cuda(0));
    } catch (const Error& e) {
      if (std::string(e.what()).find("has no kernel on cuda") == std::string::npos) throw;
      without_kernel.insert(c.kind.empty() ? c.op : c.op + "(" + c.kind + ")");
      continue;
    }
    const std::vector<Tensor> want = run_on(c, Device::cpu());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const Tolerance tol = c.cuda[std::min(i, c.cuda.size() - 1)];
      int64_t first = -1;
      const int64_t bad = count_off(got[i], want[i], tol, &first);
      EXPECT_EQ(bad, 0) << "output " << i << ": " << bad << " of " << want[i].numel()
                        << " elements off; first at " << first << ": got "
                        << (first >= 0 ? got[i].item_as_double(first) : 0.0) << ", want "
                        << (first >= 0 ? want[i].item_as_double(first) : 0.0);
    }
  }
  std::string list;
  for (const std::string& op : without_kernel) list += " " + op;
  std::printf("ops without a CUDA kernel (%zu):%s\n", without_kernel.size(), list.c_str());
#endif
}

}  // namespace
}  // namespace megatron::ops::testing
