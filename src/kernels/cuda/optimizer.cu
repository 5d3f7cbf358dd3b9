// Optimizer kernels: SGD with momentum (ops::sgd_step); multi-tensor AdamW over every parameter in
// one launch (a chunk table maps blocks to (tensor, offset); ops::adamw_step is its one-tensor
// case), writing the fp32, bf16 or fp16 model copy; the global squared L2 norm (per-chunk partial
// sums in double, then summed in chunk order: deterministic; also per tensor,
// ops::l2_norm_squared_each), the inf/NaN check and scaling for loss-scale unscaling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 65536;  // elements per block

enum ModelDType : int32_t { kNone = 0, kF32 = 1, kBF16 = 2, kF16 = 3 };

struct TensorEntry {
  float* master;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* model;
  int32_t model_dtype;
  int64_t n;
};

struct ChunkRef {
  int32_t tensor;
  int64_t start;
};

struct AdamScalars {
  float lr, beta1, beta2, eps, wd, bc1, bc2;
};

__device__ inline void adamw_element(const TensorEntry& e, int64_t i, const AdamScalars& c) {
  const float g = e.grad[i];
  const float m = c.beta1 * e.exp_avg[i] + (1.0f - c.beta1) * g;
  const float v = c.beta2 * e.exp_avg_sq[i] + (1.0f - c.beta2) * g * g;
  e.exp_avg[i] = m;
  e.exp_avg_sq[i] = v;
  float p = e.master[i];
  p -= c.lr * ((m / c.bc1) / (sqrtf(v / c.bc2) + c.eps) + c.wd * p);
  e.master[i] = p;
  switch (e.model_dtype) {
    case kF32: static_cast<float*>(e.model)[i] = p; break;
    case kBF16: static_cast<__nv_bfloat16*>(e.model)[i] = __float2bfloat16_rn(p); break;
    case kF16: static_cast<__half*>(e.model)[i] = __float2half_rn(p); break;
    default: break;
  }
}

__global__ void adamw_kernel(const TensorEntry* entries, const ChunkRef* chunks, AdamScalars c) {
  const ChunkRef ref = chunks[blockIdx.x];
  const TensorEntry e = entries[ref.tensor];
  const int64_t end = min(e.n, ref.start + kChunk);
  for (int64_t i = ref.start + threadIdx.x; i < end; i += blockDim.x) adamw_element(e, i, c);
}

// One tensor: the entry passed by value (no table to copy to the device).
__global__ void adamw_one_kernel(TensorEntry e, AdamScalars c) {
  MG_GRID_STRIDE(i, e.n) adamw_element(e, i, c);
}

// torch.optim.SGD: g' = g + wd p; buf = g' (fresh) or momentum buf + g'; p -= lr buf.
__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, float lr, float wd,
                           float momentum, bool fresh) {
  MG_GRID_STRIDE(i, n) {
    const float gi = g[i] + wd * p[i];
    const float bi = fresh ? gi : momentum * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr * bi;
  }
}

struct PlainEntry {
  float* data;
  int64_t n;
};

__global__ void sumsq_kernel(const PlainEntry* entries, const ChunkRef* chunks, double* partial) {
  __shared__ double shared[kThreads];
  const ChunkRef ref = chunks[blockIdx.x];
  const PlainEntry e = entries[ref.tensor];
  const int64_t end = min(e.n, ref.start + kChunk);
  double s = 0.0;
  for (int64_t i = ref.start + threadIdx.x; i < end; i += blockDim.x) {
    const double v = e.data[i];
    s += v * v;
  }
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) shared[threadIdx.x] += shared[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

__global__ void sum_partials_kernel(const double* partial, int64_t n, double* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += partial[i];
  *out = s;
}

// Each tensor's partial sums in chunk order (its chunks are first[t] .. first[t + 1] - 1): the
// same order for every call, so deterministic.
__global__ void sum_partials_each_kernel(const double* partial, const int64_t* first, int64_t n,
                                         double* out) {
  MG_GRID_STRIDE(t, n) {
    double s = 0.0;
    for (int64_t c = first[t]; c < first[t + 1]; ++c) s += partial[c];
    out[t] = s;
  }
}

__global__ void nonfinite_kernel(const PlainEntry* entries, const ChunkRef* chunks, int* flag) {
  const ChunkRef ref = chunks[blockIdx.x];
  const PlainEntry e = entries[ref.tensor];
  const int64_t end = min(e.n, ref.start + kChunk);
  bool bad = false;
  for (int64_t i = ref.start + threadIdx.x; i < end; i += blockDim.x) bad |= !isfinite(e.data[i]);
  if (bad) *flag = 1;
}

__global__ void scale_chunks_kernel(const PlainEntry* entries, const ChunkRef* chunks, float s) {
  const ChunkRef ref = chunks[blockIdx.x];
  const PlainEntry e = entries[ref.tensor];
  const int64_t end = min(e.n, ref.start + kChunk);
  for (int64_t i = ref.start + threadIdx.x; i < end; i += blockDim.x) e.data[i] *= s;
}

// Copies a host vector of trivially copyable structs into a new device tensor.
template <typename T>
Tensor to_device(const std::vector<T>& v, Device dev) {
  Tensor h = Tensor::empty({int64_t(v.size() * sizeof(T))}, DType::U8, Device::cpu());
  std::memcpy(h.raw_data(), v.data(), v.size() * sizeof(T));
  return h.to(dev);
}

template <typename Entry>
void add_chunks(std::vector<ChunkRef>& chunks, int32_t index, const Entry& e) {
  for (int64_t s = 0; s < e.n; s += kChunk) chunks.push_back({index, s});
}

struct PlainTable {
  Tensor entries, chunks;
  int64_t num_chunks = 0;
  Device device;
};

PlainTable plain_table(const char* op, const std::vector<Tensor>& tensors) {
  std::vector<PlainEntry> entries;
  std::vector<ChunkRef> chunks;
  PlainTable t;
  for (const Tensor& x : tensors) {
    detail::require_f32(op, "tensor", x);
    if (entries.empty()) t.device = x.device();
    entries.push_back({x.data<float>(), x.numel()});
    add_chunks(chunks, int32_t(entries.size() - 1), entries.back());
  }
  t.num_chunks = int64_t(chunks.size());
  if (t.num_chunks == 0) return t;
  t.entries = to_device(entries, t.device);
  t.chunks = to_device(chunks, t.device);
  return t;
}

TensorEntry adamw_entry(const char* op, const AdamWTensors& p) {
  detail::require_f32(op, "master", p.master);
  detail::require_f32(op, "grad", p.grad);
  detail::require_f32(op, "exp_avg", p.exp_avg);
  detail::require_f32(op, "exp_avg_sq", p.exp_avg_sq);
  const int64_t n = p.master.numel();
  MG_CHECK(p.grad.numel() == n && p.exp_avg.numel() == n && p.exp_avg_sq.numel() == n, op,
           ": sizes differ");
  int32_t md = kNone;
  void* model = nullptr;
  if (p.model_copy.defined() && p.model_copy.raw_data() != p.master.raw_data()) {
    detail::require_cuda(op, "model_copy", p.model_copy);
    MG_CHECK(p.model_copy.numel() == n, op, ": model_copy size");
    switch (p.model_copy.dtype()) {
      case DType::F32: md = kF32; break;
      case DType::BF16: md = kBF16; break;
      case DType::F16: md = kF16; break;
      default: MG_THROW(op, ": unsupported model dtype ", dtype_name(p.model_copy.dtype()));
    }
    model = p.model_copy.raw_data();
  }
  return {p.master.data<float>(), p.grad.data<float>(), p.exp_avg.data<float>(),
          p.exp_avg_sq.data<float>(), model, md, n};
}

AdamScalars adam_scalars(const ops::AdamWConfig& cfg) {
  MG_CHECK(cfg.step >= 1, "adamw_step: step must be >= 1");
  return {cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
          1.0f - float(std::pow(double(cfg.beta1), double(cfg.step))),
          1.0f - float(std::pow(double(cfg.beta2), double(cfg.step)))};
}

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& model_copy, const ops::AdamWConfig& cfg) {
  const TensorEntry e =
      adamw_entry("adamw_step", AdamWTensors{master, grad, exp_avg, exp_avg_sq, model_copy});
  const AdamScalars c = adam_scalars(cfg);
  if (e.n == 0) return;
  adamw_one_kernel<<<detail::grid_for(e.n, kThreads), kThreads, 0, stream()>>>(e, c);
  MG_CUDA_LAUNCH_CHECK();
}

void adamw_multi_tensor(const std::vector<AdamWTensors>& params, const ops::AdamWConfig& cfg) {
  const char* op = "cuda::adamw_multi_tensor";
  std::vector<TensorEntry> entries;
  std::vector<ChunkRef> chunks;
  Device dev;
  for (const AdamWTensors& p : params) {
    dev = p.master.device();
    entries.push_back(adamw_entry(op, p));
    add_chunks(chunks, int32_t(entries.size() - 1), entries.back());
  }
  if (chunks.empty()) return;
  const AdamScalars c = adam_scalars(cfg);
  Tensor e = to_device(entries, dev), ch = to_device(chunks, dev);
  adamw_kernel<<<unsigned(chunks.size()), kThreads, 0, stream()>>>(
      static_cast<const TensorEntry*>(e.raw_data()), static_cast<const ChunkRef*>(ch.raw_data()), c);
  MG_CUDA_LAUNCH_CHECK();
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
              float weight_decay, float momentum, bool first_step) {
  const char* op = "sgd_step";
  detail::require_f32(op, "param", param);
  detail::require_f32(op, "grad", grad);
  detail::require_f32(op, "momentum_buf", momentum_buf);
  detail::require_same_numel(op, param, grad);
  detail::require_same_numel(op, param, momentum_buf);
  const int64_t n = param.numel();
  if (n == 0) return;
  sgd_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream()>>>(
      param.data<float>(), grad.data<float>(), momentum_buf.data<float>(), n, lr, weight_decay,
      momentum, momentum == 0.0f || first_step);
  MG_CUDA_LAUNCH_CHECK();
}

double l2_norm_squared(const std::vector<Tensor>& tensors) {
  PlainTable t = plain_table("cuda::l2_norm_squared", tensors);
  if (t.num_chunks == 0) return 0.0;
  Tensor partial = Tensor::empty({t.num_chunks}, DType::F64, t.device);
  Tensor total = Tensor::empty({1}, DType::F64, t.device);
  sumsq_kernel<<<unsigned(t.num_chunks), kThreads, 0, stream()>>>(
      static_cast<const PlainEntry*>(t.entries.raw_data()),
      static_cast<const ChunkRef*>(t.chunks.raw_data()), partial.data<double>());
  MG_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<1, 32, 0, stream()>>>(partial.data<double>(), t.num_chunks,
                                              total.data<double>());
  MG_CUDA_LAUNCH_CHECK();
  return total.to(Device::cpu()).data<double>()[0];
}

std::vector<double> l2_norm_squared_each(const std::vector<Tensor>& xs) {
  const char* op = "cuda::l2_norm_squared_each";
  std::vector<double> out(xs.size(), 0.0);
  bool plain = true;  // every tensor contiguous fp32 (gradients are): one launch, one read-back
  for (const Tensor& x : xs) plain = plain && x.dtype() == DType::F32 && x.is_contiguous();
  if (!plain) {
    for (size_t i = 0; i < xs.size(); ++i) out[i] = l2_norm_squared(xs[i]);
    return out;
  }
  std::vector<int64_t> first(xs.size() + 1, 0);
  std::vector<Tensor> nonempty;
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::require_cuda(op, "tensor", xs[i]);
    first[i + 1] = first[i] + (xs[i].numel() + kChunk - 1) / kChunk;
    if (xs[i].numel() > 0) nonempty.push_back(xs[i]);
  }
  PlainTable t = plain_table(op, nonempty);  // the same chunks, in the same order
  if (t.num_chunks == 0) return out;
  MG_CHECK(t.num_chunks == first.back(), op, ": chunk count");
  Tensor partial = Tensor::empty({t.num_chunks}, DType::F64, t.device);
  Tensor sums = Tensor::empty({int64_t(xs.size())}, DType::F64, t.device);
  Tensor first_dev = to_device(first, t.device);
  sumsq_kernel<<<unsigned(t.num_chunks), kThreads, 0, stream()>>>(
      static_cast<const PlainEntry*>(t.entries.raw_data()),
      static_cast<const ChunkRef*>(t.chunks.raw_data()), partial.data<double>());
  MG_CUDA_LAUNCH_CHECK();
  const int64_t n = int64_t(xs.size());
  sum_partials_each_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream()>>>(
      partial.data<double>(), static_cast<const int64_t*>(first_dev.raw_data()), n,
      sums.data<double>());
  MG_CUDA_LAUNCH_CHECK();
  const Tensor host = sums.to(Device::cpu());
  std::memcpy(out.data(), host.data<double>(), out.size() * sizeof(double));
  return out;
}

bool all_finite(const std::vector<Tensor>& tensors) {
  PlainTable t = plain_table("cuda::all_finite", tensors);
  if (t.num_chunks == 0) return true;
  Tensor flag = Tensor::zeros({1}, DType::I32, t.device);
  nonfinite_kernel<<<unsigned(t.num_chunks), kThreads, 0, stream()>>>(
      static_cast<const PlainEntry*>(t.entries.raw_data()),
      static_cast<const ChunkRef*>(t.chunks.raw_data()), flag.data<int>());
  MG_CUDA_LAUNCH_CHECK();
  return flag.to(Device::cpu()).data<int>()[0] == 0;
}

void scale_all(const std::vector<Tensor>& tensors, float s) {
  PlainTable t = plain_table("cuda::scale_all", tensors);
  if (t.num_chunks == 0) return;
  scale_chunks_kernel<<<unsigned(t.num_chunks), kThreads, 0, stream()>>>(
      static_cast<const PlainEntry*>(t.entries.raw_data()),
      static_cast<const ChunkRef*>(t.chunks.raw_data()), s);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
