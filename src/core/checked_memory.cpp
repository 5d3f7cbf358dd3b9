// The checking device's allocator (mmap'd pages, PROT_NONE while closed) and HostAccess.
#include "core/checked_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace megatron {

namespace {

size_t page_bytes() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

// Whole pages for an allocation of `bytes` (at least one, so that empty tensors have memory).
size_t mapped_bytes(size_t bytes) {
  const size_t page = page_bytes();
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

void protect(void* p, size_t bytes, int prot) {
  MG_CHECK(mprotect(p, mapped_bytes(bytes), prot) == 0, "checking device: mprotect failed: ",
           std::strerror(errno));
}

struct CheckedAllocator final : Allocator {
  void* allocate(size_t bytes, Device device) override {
    MG_CHECK(device.is_checked(), "checking-device allocator asked for ", device.to_string());
    void* p = mmap(nullptr, mapped_bytes(bytes), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      MG_THROW("checking device: out of memory mapping ", bytes, " bytes (", std::strerror(errno),
               ")");
    return p;
  }
  void deallocate(void* ptr, size_t bytes, Device) override { munmap(ptr, mapped_bytes(bytes)); }
};

}  // namespace

void register_checked_memory() {
  static CheckedAllocator* allocator = new CheckedAllocator();  // outlives every tensor
  register_allocator(DeviceType::Checked, allocator);
}

void HostAccess::open(const Tensor& t) {
  if (!t.defined() || !t.device().is_checked()) return;
  const std::shared_ptr<Storage>& s = t.storage();
  if (s->host_access_++ == 0) protect(s->data(), s->bytes(), PROT_READ | PROT_WRITE);
  opened_.push_back(s);
}

HostAccess::~HostAccess() {
  for (auto it = opened_.rbegin(); it != opened_.rend(); ++it) {
    Storage& s = **it;
    // Closing cannot fail on pages this allocator mapped; if it did, nothing checks any more.
    if (--s.host_access_ == 0 && mprotect(s.data(), mapped_bytes(s.bytes()), PROT_NONE) != 0)
      std::abort();
  }
}

namespace detail {

void throw_closed_checked_memory(const Tensor& t) {
  throw InternalError(str(
      "a tensor ", shape_str(t.shape()), " ", dtype_name(t.dtype()), " on ",
      t.device().to_string(), " (storage of ", t.storage()->bytes(), " bytes, byte offset ",
      t.byte_offset(), ") was read or written outside an op: host code must compute through "
      "ops:: and read tensors through explicit copies (Tensor::to(Device::cpu()), copy_)"));
}

}  // namespace detail

}  // namespace megatron
