// The checking device's memory (DeviceType::Checked, for tests): host memory that host code
// cannot read. Every allocation is its own mmap'd pages, kept PROT_NONE except while a HostAccess
// scope holds it open: an op of the checked backend (src/kernels/checked/, the CPU kernels with
// the pages of the call's tensors opened) or an explicit copy (Tensor::copy_, to, clone, zero_,
// fill_). Tensor::data() / raw_data() on a closed tensor throw InternalError naming the tensor, and
// a pointer kept from elsewhere faults. Code that reads or writes tensor memory outside ops (which
// on a GPU would dereference device addresses) therefore fails on this device instead of passing.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace megatron {

// Registers the checking device's allocator (idempotent). ops::register_checked_backend() calls
// it together with the op table; tests use testing::checked_device().
void register_checked_memory();

// Opens the memory of tensors on the checking device for host access until destruction; scopes
// nest, tensors on other devices are ignored. Used from one thread at a time (the thread issuing
// ops; the kernels' worker threads only use what is open).
class HostAccess {
 public:
  HostAccess() = default;
  ~HostAccess();
  HostAccess(const HostAccess&) = delete;
  HostAccess& operator=(const HostAccess&) = delete;
  void open(const Tensor& t);
  void open(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) open(t);
  }

 private:
  std::vector<std::shared_ptr<Storage>> opened_;
};

}  // namespace megatron
