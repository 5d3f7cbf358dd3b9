// CUDA runtime pieces: device selection, the backend stream, the caching allocator and
// host<->device copies. See cuda_backend.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_profile.h"

namespace megatron::cuda {

namespace {

std::mutex g_mutex;
int g_device = -1;
cudaStream_t g_stream = nullptr;

// The op profile's device timer: pairs of events on the stream, kept for reuse.
struct EventPairs {
  std::mutex mu;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pairs;
  std::vector<int> free_ids;
};
EventPairs& event_pairs() {
  static EventPairs* e = new EventPairs();  // used by the profile's report at exit
  return *e;
}
int timer_start() {
  EventPairs& e = event_pairs();
  std::lock_guard<std::mutex> lock(e.mu);
  int id;
  if (!e.free_ids.empty()) {
    id = e.free_ids.back();
    e.free_ids.pop_back();
  } else {
    std::pair<cudaEvent_t, cudaEvent_t> p;
    MG_CUDA_CHECK(cudaEventCreate(&p.first));
    MG_CUDA_CHECK(cudaEventCreate(&p.second));
    e.pairs.push_back(p);
    id = int(e.pairs.size()) - 1;
  }
  MG_CUDA_CHECK(cudaEventRecord(e.pairs[size_t(id)].first, g_stream));
  return id;
}
void timer_stop(int id) {
  EventPairs& e = event_pairs();
  std::lock_guard<std::mutex> lock(e.mu);
  MG_CUDA_CHECK(cudaEventRecord(e.pairs[size_t(id)].second, g_stream));
}
double timer_seconds(int id) {
  EventPairs& e = event_pairs();
  std::lock_guard<std::mutex> lock(e.mu);
  const auto& p = e.pairs[size_t(id)];
  e.free_ids.push_back(id);
  MG_CUDA_CHECK(cudaEventSynchronize(p.second));
  float ms = 0.0f;
  MG_CUDA_CHECK(cudaEventElapsedTime(&ms, p.first, p.second));
  return double(ms) * 1e-3;
}

// Caching allocator: freed blocks are kept by size and handed out again, so a training step
// that repeats the same allocation pattern makes no cudaMalloc after the first step. Sizes are
// rounded (512 B below 1 MiB, 2 MiB above) so near sizes share blocks; a cached block is reused
// for a request of at least half its size. All kernels run on one stream, so a block freed by the
// host can be reused at once: work that still reads it is ordered before any new use.
class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Device device) override {
    MG_CHECK(device.is_cuda() && device.index == g_device, "allocation on ", device.to_string(),
             " but the CUDA backend runs on cuda:", g_device);
    const size_t size = round(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(size);
    void* p = nullptr;
    size_t got = size;
    if (it != free_.end() && it->first <= 2 * size) {
      got = it->first;
      p = it->second;
      free_.erase(it);
    } else {
      p = malloc_or_retry(size);
    }
    live_[p] = got;
    stats_.allocated_bytes += got;
    ++stats_.live_allocations;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return p;
  }

  void deallocate(void* ptr, size_t, Device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    MG_CHECK(it != live_.end(), "CUDA free of a pointer this allocator did not hand out");
    stats_.allocated_bytes -= it->second;
    --stats_.live_allocations;
    free_.emplace(it->second, ptr);
    live_.erase(it);
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached();
  }

  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

 private:
  static size_t round(size_t bytes) {
    constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSplit = size_t(1) << 20;
    const size_t unit = bytes < kSplit ? kSmall : kLarge;
    return (bytes + unit - 1) / unit * unit;
  }

  void release_cached() {  // caller holds mutex_
    if (free_.empty()) return;
    cudaStreamSynchronize(g_stream);
    for (auto& [size, p] : free_) {
      cudaFree(p);
      stats_.reserved_bytes -= size;
    }
    free_.clear();
  }

  void* malloc_or_retry(size_t size) {  // caller holds mutex_
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state
      release_cached();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      MG_THROW("CUDA out of memory: could not allocate ", size >> 20, " MiB on cuda:", g_device,
               " (", stats_.allocated_bytes >> 20, " MiB in tensors, ", stats_.reserved_bytes >> 20,
               " MiB reserved, ", free_b >> 20, " of ", total_b >> 20,
               " MiB free on the device); reduce --micro-batch-size or use "
               "--recompute-granularity");
    }
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.device_mallocs;
    return p;
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> live_;
  AllocatorStats stats_;
};

CachingAllocator& caching_allocator() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed: tensors may outlive main
  return *a;
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (dst_device.is_cpu() && src_device.is_cuda()) kind = cudaMemcpyDeviceToHost;
  if (dst_device.is_cuda() && src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  MG_CHECK(!(dst_device.is_cpu() && src_device.is_cpu()), "device_copy between host buffers");
  MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, g_stream));
  // Host buffers are pageable: the copy must be complete before the caller touches them.
  if (kind != cudaMemcpyDeviceToDevice) MG_CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

void device_copy_2d(void* dst, Device dst_device, size_t dst_pitch, const void* src,
                    Device src_device, size_t src_pitch, size_t row_bytes, size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (dst_device.is_cpu() && src_device.is_cuda()) kind = cudaMemcpyDeviceToHost;
  if (dst_device.is_cuda() && src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  MG_CHECK(!(dst_device.is_cpu() && src_device.is_cpu()), "device_copy_2d between host buffers");
  MG_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, kind, g_stream));
  if (kind != cudaMemcpyDeviceToDevice) MG_CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

void device_zero(void* dst, size_t bytes) {
  MG_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, g_stream));
}

}  // namespace

namespace detail {
cudaStream_t stream() {
  MG_CHECK(g_stream != nullptr, "CUDA backend used before megatron::cuda::init()");
  return g_stream;
}
}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool available() { return device_count() > 0; }

std::string device_name(int device) {
  cudaDeviceProp prop{};
  MG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void init(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_device == device) return;
  MG_REQUIRE(g_device < 0, "the CUDA backend is already running on cuda:", g_device,
             "; one process uses one GPU");
  const int n = device_count();
  MG_REQUIRE(n > 0, "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)");
  MG_REQUIRE(device >= 0 && device < n, "CUDA device ", device, " requested but only ", n,
             " visible");
  MG_CUDA_CHECK(cudaSetDevice(device));
  MG_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  g_device = device;
  register_allocator(DeviceType::CUDA, &caching_allocator());
  register_device_copy(DeviceType::CUDA, &device_copy);
  register_device_zero(DeviceType::CUDA, &device_zero);
  register_device_copy_2d(DeviceType::CUDA, &device_copy_2d);
  ops::register_backend(DeviceType::CUDA, &op_table());
  ops::profile::set_device_sync([] { MG_CUDA_CHECK(cudaStreamSynchronize(g_stream)); });
  ops::profile::set_device_timer({&timer_start, &timer_stop, &timer_seconds});
}

void synchronize() { MG_CUDA_CHECK(cudaStreamSynchronize(detail::stream())); }

void* stream_handle() { return detail::stream(); }

AllocatorStats allocator_stats() { return caching_allocator().stats(); }

void empty_cache() { caching_allocator().empty_cache(); }

void reset_peak_stats() { caching_allocator().reset_peaks(); }

}  // namespace megatron::cuda
