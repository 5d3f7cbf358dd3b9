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

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
};

// Memory for one device kind. The CPU allocator is built in; the CUDA backend registers its
// caching allocator at start-up. Contract: allocate returns memory aligned to 64 bytes or throws.
struct Allocator {
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t bytes, Device device) = 0;
};
void register_allocator(DeviceType type, Allocator* allocator);
Allocator* allocator_for(DeviceType type);
// Byte copies between devices (host<->device, device<->device), registered by the CUDA backend
// with its allocator; Tensor::to(Device) and copy_ use it for tensors on different devices.
using DeviceCopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                              size_t bytes);
void register_device_copy(DeviceCopyFn fn);

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

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::shared_ptr<void> keep_alive_;
  bool owned_ = true;
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
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

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

  void* raw_data() const { return static_cast<char*>(storage_->data()) + offset_; }
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

  // Copies.
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;     // converts (CPU); returns a new tensor
  Tensor to(Device device) const;   // copies across devices
  void copy_(const Tensor& src);    // same shape; converts dtype (CPU)
  void zero_();
  void fill_(double value);

  // Element access for tests and small host code (CPU, any float dtype; slow).
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
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  MG_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_v<T>);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace megatron
