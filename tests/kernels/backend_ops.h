// The table of op cases run on every backend (as ggml's test-backend-ops): each case makes its
// inputs on the host from fixed seeds, moves them to a device, runs one op there and returns the
// outputs; backend_ops_test.cpp compares every backend's outputs with the CPU's. Adding an op =
// adding its cases to backend_op_cases.cpp (the attention ops': backend_op_cases_attention.cpp;
// helpers in op_case_util.h; a test fails while an op of MG_FOR_EACH_OP has none);
// adding a norm or activation kind = adding its cases there too (a test fails while a kind of
// kernels/op_kinds.h has no forward or no backward case).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace megatron::ops::testing {

// |got - cpu| <= atol + rtol |cpu| for every element.
struct Tolerance {
  double atol = 1e-5, rtol = 1e-5;
};

struct OpCase {
  std::string op;    // the ops:: function covered (a name of MG_FOR_EACH_OP)
  std::string what;  // shapes, dtypes and flags
  // Runs the op on `device`; returns its outputs (on `device`, or host scalars).
  std::function<std::vector<Tensor>(Device)> run;
  // Allowed difference from the CPU on CUDA, per output (the last entry covers the rest).
  std::vector<Tolerance> cuda = {Tolerance{}};
  // For the ops that take a kind (norm_*, activation_*): the kind's name in kernels/op_kinds.h.
  std::string kind;
};

std::vector<OpCase> backend_op_cases();

}  // namespace megatron::ops::testing
