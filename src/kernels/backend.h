// The backend interface behind ops.h (as ggml's backend interface): a table of function
// pointers per device type, one entry per op with the op's own signature. Each ops:: function
// finds the device of its tensors (all on one device, else Error naming the op and the devices),
// looks up that device's table once and calls the entry; a missing entry (an op this backend has
// no kernel for) throws Error naming the op and the device.
//
// Backends: the CPU (src/kernels/cpu/, always registered), the checking device
// (src/kernels/checked/: the CPU kernels over guarded host memory, registered by tests) and
// CUDA (src/kernels/cuda/, registered by cuda::init; every op, tests/cuda/cuda_op_table_test.cpp).
// Adding an op: declare it in ops.h, add its name to MG_FOR_EACH_OP, define its dispatcher in
// ops.cpp and its CPU kernel in ops::cpu, and add its cases to tests/kernels/backend_op_cases.cpp.
// Adding a norm or an MLP activation is not adding an op: norm_fwd / norm_bwd and
// activation_fwd / activation_bwd take the kind (op_kinds.h), so a new kind is its
// rows in op_kinds.h and model/layer_kinds.h, its CPU kernel (a NormKernel<id> in
// cpu/cpu_norm.cpp or an Activation<id> in cpu/cpu_activation.cpp, found by id at compile time)
// and its cases in tests/kernels/backend_op_cases.cpp (and, in a CUDA build, its CUDA kernel in
// cuda/norm.cu or cuda/activation.cu, which instantiate every kind). Another backend's entry for
// these ops may run only the kinds it has kernels for and call detail::throw_no_kind_kernel for
// the rest.
#pragma once

#include <cstddef>

#include "kernels/ops.h"

// Every dispatched op of ops.h, in declaration order (alibi_slopes is a host helper, not an op).
#define MG_FOR_EACH_OP(X)                                                                        \
  X(gemm) X(gemm_batched)                                                                        \
  X(embedding_fwd) X(embedding_bwd) X(vocab_parallel_embedding_fwd)                              \
  X(vocab_parallel_embedding_bwd)                                                                \
  X(norm_fwd) X(norm_bwd) X(activation_fwd) X(activation_bwd)                                    \
  X(bias_add) X(bias_grad) X(add) X(scale) X(tanh_fwd) X(tanh_bwd)                              \
  X(index_select_rows) X(index_copy_rows) X(copy_to_flat) X(copy_from_flat)                      \
  X(dropout_fwd) X(dropout_bwd) X(bias_dropout_add_fwd) X(bias_dropout_add_bwd)                  \
  X(attention_fwd) X(attention_bwd) X(attention_merge)                                          \
  X(rope_fwd) X(rope_bwd) X(kv_cache_append)                                                     \
  X(softmax_xent_fwd_bwd)                                                                        \
  X(vocab_parallel_xent_max) X(vocab_parallel_xent_partials) X(vocab_parallel_xent_loss)         \
  X(vocab_parallel_xent_bwd)                                                                     \
  X(adamw_step) X(sgd_step)                                                                      \
  X(l2_norm_squared) X(l2_norm_squared_each) X(sum) X(dot) X(all_finite) X(int_range) X(cast)

namespace megatron::ops {

// One backend's kernels: entry `name` has the type of ops::name (without default arguments);
// nullptr where the backend has no kernel for the op.
struct OpTable {
#define MG_OP_TABLE_ENTRY(name) decltype(&ops::name) name = nullptr;
  MG_FOR_EACH_OP(MG_OP_TABLE_ENTRY)
#undef MG_OP_TABLE_ENTRY
};

inline constexpr size_t kDeviceTypeCount = 3;  // DeviceType::CPU, CUDA, Checked

// Installs (or replaces) the table for a device type; nullptr removes it. The table must outlive
// every op call. Called at start-up (CUDA's init, the tests' checked_device()), not during ops.
void register_backend(DeviceType type, const OpTable* table);
const OpTable* backend_for(DeviceType type);  // nullptr when none is registered

namespace cpu {
extern const OpTable kOps;  // the CPU kernels (src/kernels/cpu/)
}

namespace detail {

extern const OpTable* g_backends[kDeviceTypeCount];
[[noreturn]] void throw_mixed_devices(const char* op, Device a, Device b);
[[noreturn]] void throw_no_kernel(const char* op, Device device);
// For a backend whose kind-taking op (norm_*, activation_*) has no kernel for `kind` (or an id
// outside the kind enum): Error naming the op, the kind and the device.
[[noreturn]] void throw_no_kind_kernel(const char* op, NormId kind, Device device);
[[noreturn]] void throw_no_kind_kernel(const char* op, ActivationId kind, Device device);

// The one device of an op's tensor arguments (undefined tensors are skipped).
struct CallDevice {
  const char* op;
  Device device{};
  bool found = false;
  void add(const Tensor& t) {
    if (!t.defined()) return;
    const Device d = t.device();
    if (!found) {
      device = d;
      found = true;
    } else if (d != device) [[unlikely]] {
      throw_mixed_devices(op, device, d);
    }
  }
  void add(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) add(t);
  }
  // An argument struct holding tensors (AttentionInputs, ...) shows them by for_each_tensor.
  template <typename T>
    requires requires(const T& t) { t.for_each_tensor([](const Tensor&) {}); }
  void add(const T& t) {
    t.for_each_tensor([this](const Tensor& x) { add(x); });
  }
  template <typename T>
  void add(const T&) {}  // not a tensor
};

// Calls entry M of the backend of the arguments' device.
template <auto M, typename... Args>
decltype(auto) dispatch(const char* op, const Args&... args) {
  CallDevice call{op};
  (call.add(args), ...);
  const OpTable* table = g_backends[size_t(call.device.type)];
  const auto fn = table != nullptr ? table->*M : nullptr;
  if (fn == nullptr) [[unlikely]] throw_no_kernel(op, call.device);
  return fn(args...);
}

}  // namespace detail
}  // namespace megatron::ops
