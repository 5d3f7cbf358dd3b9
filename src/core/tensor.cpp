#include "core/tensor.h"

#include "core/checked_memory.h"
#include "core/host_memory.h"
#include "core/input_bounds.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace megatron {

void tune_host_allocator() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

namespace {

// Bytes of tensor storage the host allocator holds now and at most (host_memory_stats).
std::atomic<size_t> g_host_allocated{0}, g_host_peak{0};

struct CpuAllocator final : Allocator {
  void* allocate(size_t bytes, Device) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw OutOfMemory(str("out of host memory allocating ", bytes, " bytes"));
    const size_t now = g_host_allocated.fetch_add(bytes) + bytes;
    size_t peak = g_host_peak.load();
    while (now > peak && !g_host_peak.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* ptr, size_t bytes, Device) override {
    std::free(ptr);
    g_host_allocated.fetch_sub(bytes);
  }
};

CpuAllocator g_cpu_allocator;
Allocator* g_allocators[3] = {&g_cpu_allocator, nullptr, nullptr};  // by DeviceType
DeviceCopyFn g_device_copies[3] = {nullptr, nullptr, nullptr};
DeviceZeroFn g_device_zeros[3] = {nullptr, nullptr, nullptr};
DeviceCopy2dFn g_device_copies_2d[3] = {nullptr, nullptr, nullptr};

template <typename T>
double load_as_double(const void* p) {
  const T v = *static_cast<const T*>(p);
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  else if constexpr (std::is_same_v<T, fp16>) return fp16_to_float(v);
  else return double(v);
}

template <typename T>
void store_from_double(void* p, double v) {
  if constexpr (std::is_same_v<T, bf16>) *static_cast<T*>(p) = float_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, fp16>) *static_cast<T*>(p) = float_to_fp16(float(v));
  else *static_cast<T*>(p) = T(v);
}

template <typename F>
auto dispatch(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::F16: return f(fp16{});
    case DType::BF16: return f(bf16{});
    case DType::I8: return f(int8_t{});
    case DType::U8: return f(uint8_t{});
    case DType::I16: return f(int16_t{});
    case DType::U16: return f(uint16_t{});
    case DType::I32: return f(int32_t{});
    case DType::I64: return f(int64_t{});
  }
  MG_CHECK(false, "bad dtype");
  __builtin_unreachable();
}

// Calls fn(flat_logical_index, element_byte_offset) for every element in row-major order.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, size_t elem, Fn&& fn) {
  const int nd = int(shape.size());
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, off * int64_t(elem));
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

std::string Device::to_string() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return str("cuda:", index);
    case DeviceType::Checked: return str("checked:", index);
  }
  return str("device type ", int(type));
}

HostMemoryStats host_memory_stats() { return {g_host_allocated.load(), g_host_peak.load()}; }
void reset_host_memory_peak() { g_host_peak.store(g_host_allocated.load()); }

void register_allocator(DeviceType type, Allocator* allocator) {
  g_allocators[int(type)] = allocator;
}

void register_device_copy(DeviceType type, DeviceCopyFn fn) { g_device_copies[int(type)] = fn; }
void register_device_zero(DeviceType type, DeviceZeroFn fn) { g_device_zeros[int(type)] = fn; }
void register_device_copy_2d(DeviceType type, DeviceCopy2dFn fn) {
  g_device_copies_2d[int(type)] = fn;
}

Allocator* allocator_for(DeviceType type) {
  Allocator* a = g_allocators[int(type)];
  MG_REQUIRE(a != nullptr, "no allocator for ", Device{type, 0}.to_string(),
             type == DeviceType::CUDA
                 ? ": this build has no CUDA backend or cuda::init was not called"
                 : ": the checking device is registered by ops::register_checked_backend()");
  return a;
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device.type)->allocate(bytes, device);
}

Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> keep_alive)
    : data_(data), bytes_(bytes), device_(device), keep_alive_(std::move(keep_alive)),
      owned_(false) {}

Storage::~Storage() {
  if (owned_ && data_) allocator_for(device_.type)->deallocate(data_, bytes_, device_);
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MG_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  uint64_t bytes = 0;
  MG_REQUIRE(checked_shape_bytes(shape, dtype_size(dtype), &bytes), "a ", dtype_name(dtype),
             " tensor of shape ", shape_str(shape), " cannot exist: its size overflows 64 bits "
             "(a corrupted file or an impossible setting asked for it)");
  Tensor t;
  t.storage_ = std::make_shared<Storage>(size_t(bytes), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  MG_CHECK(d >= 0 && d < dim(), "dimension ", d, " out of range for shape ", shape_str(shape_));
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  if (d < 0) d += dim();
  MG_CHECK(d >= 0 && d < dim(), "dimension ", d, " out of range for shape ", shape_str(shape_));
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  MG_CHECK(is_contiguous(), "view of a non-contiguous tensor ", shape_str(shape_));
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (int i = 0; i < int(s.size()); ++i) {
    if (s[i] == -1) {
      MG_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MG_CHECK(known > 0 && numel() % known == 0, "view: cannot infer ", shape_str(shape));
    s[infer] = numel() / known;
  }
  MG_CHECK(shape_numel(s) == numel(), "view: ", shape_str(shape_), " -> ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  MG_CHECK(d >= 0 && d < dim() && start >= 0 && length >= 0 && start + length <= shape_[d],
           "narrow(", d, ", ", start, ", ", length, ") of ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ += size_t(start * strides_[d]) * dtype_size(dtype_);
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += dim();
  MG_CHECK(d >= 0 && d < dim() && index >= 0 && index < shape_[d], "select(", d, ", ", index,
           ") of ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ += size_t(index * strides_[d]) * dtype_size(dtype_);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  if (a < 0) a += dim();
  if (b < 0) b += dim();
  MG_CHECK(a >= 0 && a < dim() && b >= 0 && b < dim(), "transpose(", a, ", ", b, ")");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device dev) const {
  if (dev == device()) return clone();
  Tensor t = empty(shape_, dtype_, dev);
  t.copy_(*this);
  return t;
}

namespace {

// dst <- src for host-addressable memory (already open if on the checking device).
void host_copy(const Tensor& dst, const Tensor& src) {
  const DType dt = dst.dtype(), st = src.dtype();
  if (st == dt && dst.is_contiguous() && src.is_contiguous()) {
    std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  if (st == dt && dst.dim() == 2 && dst.stride(1) == 1 && src.stride(1) == 1) {
    // Row-strided matrices (column blocks of wider ones): one copy per row.
    const size_t row = size_t(dst.size(1)) * dtype_size(dt);
    const size_t dstride = size_t(dst.stride(0)) * dtype_size(dt);
    const size_t sstride = size_t(src.stride(0)) * dtype_size(dt);
    char* d = static_cast<char*>(dst.raw_data());
    const char* s = static_cast<const char*>(src.raw_data());
    for (int64_t r = 0; r < dst.size(0); ++r)
      std::memmove(d + size_t(r) * dstride, s + size_t(r) * sstride, row);
    return;
  }
  // General path: gather source values in logical order, then scatter.
  std::vector<double> values(static_cast<size_t>(dst.numel()));
  const char* sb = static_cast<const char*>(src.raw_data());
  dispatch(st, [&](auto tag) {
    using T = decltype(tag);
    for_each_offset(src.shape(), src.strides(), dtype_size(st),
                    [&](int64_t i, int64_t off) { values[size_t(i)] = load_as_double<T>(sb + off); });
  });
  char* db = static_cast<char*>(dst.raw_data());
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    for_each_offset(dst.shape(), dst.strides(), dtype_size(dt),
                    [&](int64_t i, int64_t off) { store_from_double<T>(db + off, values[size_t(i)]); });
  });
}

// A 2-D tensor with unit inner stride: rows at a byte pitch.
bool row_strided(const Tensor& t) {
  return t.dim() == 2 && (t.stride(1) == 1 || t.size(1) <= 1) && t.stride(0) >= t.size(1);
}

// dst <- src where at least one side is on a device with its own memory: one registered byte
// copy for contiguous tensors of one dtype, one registered 2-D copy for row-strided matrices of
// one dtype; conversions, other strides and copies between two such devices go through host
// memory.
void device_copy(Tensor& dst, const Tensor& src) {
  const Device dd = dst.device(), sd = src.device();
  const bool plain = src.dtype() == dst.dtype() && dst.is_contiguous() && src.is_contiguous();
  const bool two_devices = !dd.is_host_memory() && !sd.is_host_memory() && dd.type != sd.type;
  const DeviceType owner = dd.is_host_memory() ? sd.type : dd.type;
  if (!plain && !two_devices && src.dtype() == dst.dtype() && row_strided(dst) &&
      row_strided(src) && g_device_copies_2d[int(owner)] != nullptr) {
    const size_t el = dtype_size(dst.dtype());
    const size_t row = size_t(dst.size(1)) * el;
    g_device_copies_2d[int(owner)](dst.raw_data(), dd.is_host_memory() ? Device::cpu() : dd,
                                   dst.size(0) > 1 ? size_t(dst.stride(0)) * el : row,
                                   src.raw_data(), sd.is_host_memory() ? Device::cpu() : sd,
                                   src.size(0) > 1 ? size_t(src.stride(0)) * el : row, row,
                                   size_t(dst.size(0)));
    return;
  }
  if (!plain || two_devices) {
    const Tensor& device_side = sd.is_host_memory() ? dst : src;
    MG_CHECK(device_side.is_contiguous(), "copy_ of a non-contiguous tensor on ",
             device_side.device().to_string(), " (", shape_str(device_side.shape()),
             "): make it contiguous on the device first");
    Tensor staged = Tensor::empty(device_side.shape(), device_side.dtype(), Device::cpu());
    staged.copy_(src);
    dst.copy_(staged);
    return;
  }
  const DeviceCopyFn fn = g_device_copies[int(owner)];
  MG_REQUIRE(fn != nullptr, "copy between ", sd.to_string(), " and ", dd.to_string(),
             " needs the ", Device{owner, 0}.to_string(), " backend, which this build lacks or "
             "has not initialised");
  HostAccess access;  // a side on the checking device
  access.open(dst);
  access.open(src);
  fn(dst.raw_data(), dd.is_host_memory() ? Device::cpu() : dd, src.raw_data(),
     sd.is_host_memory() ? Device::cpu() : sd, dst.nbytes());
}

}  // namespace

void Tensor::copy_(const Tensor& src) {
  MG_CHECK(src.shape_ == shape_, "copy_: shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  const Device dd = device(), sd = src.device();
  if (dd.is_cpu() && sd.is_cpu()) {
    host_copy(*this, src);
  } else if (dd.is_host_memory() && sd.is_host_memory()) {
    HostAccess access;
    access.open(*this);
    access.open(src);
    host_copy(*this, src);
  } else {
    device_copy(*this, src);
  }
}

void Tensor::zero_() {
  if (!device().is_host_memory() && is_contiguous() && g_device_zeros[int(device().type)]) {
    if (nbytes() > 0) g_device_zeros[int(device().type)](raw_data(), nbytes());
    return;
  }
  if (!device().is_host_memory() || !is_contiguous()) {
    fill_(0.0);
    return;
  }
  HostAccess access;
  access.open(*this);
  std::memset(raw_data(), 0, nbytes());
}

void Tensor::fill_(double value) {
  if (!device().is_host_memory()) {  // staged through the host: not for hot paths
    copy_(full(shape_, value, dtype_, Device::cpu()));
    return;
  }
  HostAccess access;
  access.open(*this);
  char* db = static_cast<char*>(raw_data());
  dispatch(dtype_, [&](auto tag) {
    using T = decltype(tag);
    for_each_offset(shape_, strides_, dtype_size(dtype_),
                    [&](int64_t, int64_t off) { store_from_double<T>(db + off, value); });
  });
}

double Tensor::item_as_double(int64_t flat) const {
  MG_CHECK(flat >= 0 && flat < numel(), "item index ", flat, " out of range");
  int64_t off = 0;
  for (int d = dim() - 1; d >= 0; --d) {
    off += (flat % shape_[d]) * strides_[d];
    flat /= shape_[d];
  }
  if (!device().is_cpu()) {  // copy the one element to the host
    Tensor one = *this;
    one.offset_ += size_t(off) * dtype_size(dtype_);
    one.shape_ = {1};
    one.strides_ = {1};
    return one.to(Device::cpu()).item_as_double(0);
  }
  const char* p = static_cast<const char*>(raw_data()) + off * int64_t(dtype_size(dtype_));
  return dispatch(dtype_, [&](auto tag) { return load_as_double<decltype(tag)>(p); });
}

std::vector<float> Tensor::to_float_vector() const {
  const Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  const Tensor f = host.dtype() == DType::F32 && host.is_contiguous() ? host : host.to(DType::F32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + f.numel());
}

}  // namespace megatron
