// The checking device's op table: each entry opens its tensor arguments' memory, calls the CPU
// kernel through cpu::kOps, and closes the memory again (also when the kernel throws).
#include "kernels/checked/checked_backend.h"

#include "core/checked_memory.h"

namespace megatron::ops {

namespace {

void open_argument(HostAccess& access, const Tensor& t) { access.open(t); }
void open_argument(HostAccess& access, const std::vector<Tensor>& ts) { access.open(ts); }
template <typename T>
  requires requires(const T& t) { t.for_each_tensor([](const Tensor&) {}); }
void open_argument(HostAccess& access, const T& t) {  // an argument struct holding tensors
  t.for_each_tensor([&](const Tensor& x) { access.open(x); });
}
template <typename T>
void open_argument(HostAccess&, const T&) {}  // not a tensor

// CheckedOp<&OpTable::name>::call has the op's signature.
template <auto M>
struct CheckedOp;
template <typename R, typename... Args, R (*OpTable::*M)(Args...)>
struct CheckedOp<M> {
  static R call(Args... args) {
    HostAccess access;
    (open_argument(access, args), ...);
    return (cpu::kOps.*M)(args...);
  }
};

#define MG_CHECKED_ENTRY(name) .name = &CheckedOp<&OpTable::name>::call,
constinit const OpTable kCheckedOps = {MG_FOR_EACH_OP(MG_CHECKED_ENTRY)};
#undef MG_CHECKED_ENTRY

}  // namespace

const OpTable& checked_op_table() { return kCheckedOps; }

Device register_checked_backend() {
  register_checked_memory();
  register_backend(DeviceType::Checked, &kCheckedOps);
  return Device::checked();
}

}  // namespace megatron::ops
