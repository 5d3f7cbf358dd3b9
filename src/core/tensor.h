// Tensor: shape, strides (in elements), dtype, device, shared storage and a byte offset.
// Views (view, narrow, select, transpose) share storage and are cheap. There is no autograd:
// layers compute their own backward. Ops write into tensors the caller provides.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace megatron {

// CPU: host memory. CUDA: GPU memory. Checked: the checking device for tests (host memory that
// host code cannot read outside ops and explicit copies; core/checked_memory.h).
enum class DeviceType : uint8_t { CPU, CUDA, Checked };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_checked() const { return type == DeviceType::Checked; }
  // Memory the host can address (the CPU's, and the checking device's while it is opened).
  bool is_host_memory() const { return type != DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  static Device checked() { return {DeviceType::Checked, 0}; }
};

// Memory for one device kind. The CPU allocator is built in; the CUDA backend registers its
// caching allocator at start-up. Contract: allocate returns memory aligned to 64 bytes or throws.
struct Allocator {
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t bytes, Device device) = 0;
};
void register_allocator(DeviceType type, Allocator* allocator);
// Host allocation tuned for training and generation, once per process (the CLI's main and the
// benchmarks call it): activations are allocated per step, so freed blocks up to glibc's 32 MiB
// mmap limit stay in the heap and every step reuses already-mapped pages instead of page-faulting
// fresh mmaps.
void tune_host_allocator();
Allocator* allocator_for(DeviceType type);
// Byte copies between a device with its own memory and the host, or within that device,
// registered by its backend with its allocator (CUDA); Tensor::copy_, to(Device) and clone use it.
// The host side is passed as Device::cpu().
using DeviceCopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                              size_t bytes);
void register_device_copy(DeviceType type, DeviceCopyFn fn);
// The same for `rows` rows of `row_bytes` bytes, `*_pitch` bytes apart on each side (row-strided
// 2-D tensors: column blocks of wider matrices); optional per device type.
using DeviceCopy2dFn = void (*)(void* dst, Device dst_device, size_t dst_pitch, const void* src,
                                Device src_device, size_t src_pitch, size_t row_bytes, size_t rows);
void register_device_copy_2d(DeviceType type, DeviceCopy2dFn fn);
// Zeroes `bytes` of a device's own memory (Tensor::zero_ of a contiguous tensor there, without a
// staging copy through the host); optional per device type.
using DeviceZeroFn = void (*)(void* dst, size_t bytes);
void register_device_zero(DeviceType type, DeviceZeroFn fn);

class Tensor;
class HostAccess;
namespace detail {
[[noreturn]] void throw_closed_checked_memory(const Tensor& t);
}

class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Wrap memory owned elsewhere (e.g. an mmap); `keep_alive` holds the owner.
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> keep_alive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // Checking device: the number of open HostAccess scopes holding this storage (0: closed).
  int host_access_count() const { return host_access_; }

 private:
  friend class HostAccess;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::shared_ptr<void> keep_alive_;
  bool owned_ = true;
  int host_access_ = 0;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  // Host values into a new tensor on `device` (an explicit copy for a device other than the CPU).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t stride(int d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  // The address of the first element (a device address for CUDA tensors). On the checking device
  // this throws InternalError unless an op or a copy has the memory open.
  void* raw_data() const {
    if (storage_->device().type == DeviceType::Checked && storage_->host_access_count() == 0)
        [[unlikely]]
      detail::throw_closed_checked_memory(*this);
    return static_cast<char*>(storage_->data()) + offset_;
  }
  template <typename T>
  T* data() const {
    MG_CHECK(dtype_v<T> == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ",
             dtype_name(dtype_v<T>));
    return static_cast<T*>(raw_data());
  }

  // Views (share storage).
  Tensor view(const Shape& shape) const;  // contiguous only; one dimension may be -1
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor select(int dim, int64_t index) const;  // drops `dim`
  Tensor transpose(int a, int b) const;
  Tensor operator[](int64_t i) const { return select(0, i); }

  // Copies (explicit copies: they work on every device, across devices through the registered
  // copies; a device with its own memory converts dtypes and re-strides through the host, and
  // needs contiguous tensors on its side).
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;     // converts; returns a new tensor on the same device
  Tensor to(Device device) const;   // copies across devices
  void copy_(const Tensor& src);    // same shape; converts dtype
  void zero_();
  void fill_(double value);

  // Element reads for tests and small host code (any device: explicit copies to the host, so a
  // device synchronisation each; any dtype; slow).
  double item_as_double(int64_t flat_index) const;  // flat index in logical row-major order
  std::vector<float> to_float_vector() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
};

Shape contiguous_strides(const Shape& shape);

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  MG_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_v<T>);
  std::copy(values.begin(), values.end(), t.data<T>());
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace megatron
