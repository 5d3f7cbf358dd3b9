// The per-row steps of vocab-parallel cross entropy on the GPU (ops::vocab_parallel_xent_*, the
// CPU kernels' formulas; the caller all-reduces between them). One block per token row. The first
// step checks the targets against the vocabulary (one small copy back, so a bad target is an
// Error naming the token on every rank before any collective, as on the CPU).
#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;

namespace {

constexpr int kThreads = 256;

void check_logits(const char* op, const char* name, const Tensor& logits, int64_t& n, int64_t& vl) {
  detail::require_f32(op, name, logits);
  MG_CHECK(logits.dim() == 2, op, ": ", name, " must be [n, vocab shard], got ",
           shape_str(logits.shape()));
  n = logits.size(0);
  vl = logits.size(1);
  MG_CHECK(n < (int64_t(1) << 31), op, ": too many rows");
}

void check_vec(const char* op, const char* name, const Tensor& t, int64_t n, DType dtype) {
  detail::require_cuda(op, name, t);
  MG_CHECK(t.dtype() == dtype && t.numel() == n, op, ": ", name, " must be contiguous ",
           dtype_name(dtype), " [", n, "], got ", shape_str(t.shape()));
}

void check_targets(const char* op, const Tensor& t, int64_t n) {
  detail::require_cuda(op, "targets", t);
  MG_CHECK(t.numel() == n, op, ": targets must be contiguous [", n, "]");
  MG_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64, op,
           ": targets must be int32 or int64, got ", dtype_name(t.dtype()));
}

// a = ls * V / (V - 1): Megatron's smoothing weight spread over the whole vocabulary.
double smoothing_weight(float label_smoothing, int64_t vocab) {
  return label_smoothing > 0 ? double(label_smoothing) * double(vocab) / double(vocab - 1) : 0.0;
}

__global__ void row_max_kernel(float* mx, const float* z, int64_t vl) {
  __shared__ float shared[32];
  const float* row = z + int64_t(blockIdx.x) * vl;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) m = fmaxf(m, row[j]);
  m = detail::block_max(m, shared);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

template <typename I>
__global__ void partials_kernel(float* stats, int64_t* local_target, float* z, const float* mx,
                                const I* targets, int64_t n, int64_t vl, int64_t vocab_start) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  float* row = z + i * vl;
  const float m = mx[i];
  const int64_t t = int64_t(targets[i]) - vocab_start;
  const int64_t lt = (t >= 0 && t < vl) ? t : -1;
  const float pred = lt >= 0 ? row[lt] - m : 0.0f;  // other ranks contribute 0
  __syncthreads();  // row[lt] is read before any thread overwrites it
  float se = 0.0f, sz = 0.0f;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) {
    const float zj = row[j] - m;
    sz += zj;
    const float e = expf(zj);
    row[j] = e;
    se += e;
  }
  se = detail::block_sum(se, shared);
  sz = detail::block_sum(sz, shared);
  if (threadIdx.x == 0) {
    local_target[i] = lt;
    stats[i] = pred;
    stats[n + i] = se;
    stats[2 * n + i] = sz;
  }
}

__global__ void loss_kernel(float* loss, float* z, const float* stats, int64_t n, int64_t vl,
                            int64_t vocab, double a) {
  const int64_t i = blockIdx.x;
  const float log_z = logf(stats[n + i]);
  if (threadIdx.x == 0) {
    float loss_i = log_z - stats[i];
    if (a > 0) {
      const double mean_log_p = double(stats[2 * n + i]) / double(vocab) - double(log_z);
      loss_i = float((1.0 - a) * double(loss_i) - a * mean_log_p);
    }
    loss[i] = loss_i;
  }
  const float inv = 1.0f / stats[n + i];
  float* row = z + i * vl;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) row[j] *= inv;
}

__global__ void xent_bwd_kernel(float* d, const float* sm, const int64_t* lt, const float* gl,
                                int64_t vl, float hit, float floor) {
  const int64_t i = blockIdx.x;
  const float g = gl[i];
  const int64_t t = lt[i];
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x)
    d[i * vl + j] = (sm[i * vl + j] - floor) * g - (j == t ? hit * g : 0.0f);
}

}  // namespace

void vocab_parallel_xent_max(const Tensor& logits_max, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_size) {
  const char* op = "vocab_parallel_xent_max";
  int64_t n = 0, vl = 0;
  check_logits(op, "logits", logits, n, vl);
  check_vec(op, "logits_max", logits_max, n, DType::F32);
  check_targets(op, targets, n);
  const detail::BadId bad = detail::first_id_outside(targets, 0, vocab_size);
  MG_REQUIRE(bad.position < 0, "cross entropy: target id ", bad.value, " at token ", bad.position,
             " is outside the vocabulary [0, ", vocab_size,
             "); check the tokenizer / --vocab-size of the data");
  if (n == 0) return;
  row_max_kernel<<<unsigned(n), kThreads, 0, stream()>>>(logits_max.data<float>(),
                                                         logits.data<float>(), vl);
  MG_CUDA_LAUNCH_CHECK();
}

void vocab_parallel_xent_partials(const Tensor& stats, const Tensor& local_target,
                                  const Tensor& logits, const Tensor& logits_max,
                                  const Tensor& targets, int64_t vocab_start) {
  const char* op = "vocab_parallel_xent_partials";
  int64_t n = 0, vl = 0;
  check_logits(op, "logits", logits, n, vl);
  check_vec(op, "logits_max", logits_max, n, DType::F32);
  check_vec(op, "stats", stats, 3 * n, DType::F32);
  check_vec(op, "local_target", local_target, n, DType::I64);
  check_targets(op, targets, n);
  if (n == 0) return;
  if (targets.dtype() == DType::I32)
    partials_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
        stats.data<float>(), local_target.data<int64_t>(), logits.data<float>(),
        logits_max.data<float>(), targets.data<int32_t>(), n, vl, vocab_start);
  else
    partials_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
        stats.data<float>(), local_target.data<int64_t>(), logits.data<float>(),
        logits_max.data<float>(), targets.data<int64_t>(), n, vl, vocab_start);
  MG_CUDA_LAUNCH_CHECK();
}

void vocab_parallel_xent_loss(const Tensor& loss, const Tensor& exp_logits, const Tensor& stats,
                              int64_t vocab_size, float label_smoothing) {
  const char* op = "vocab_parallel_xent_loss";
  int64_t n = 0, vl = 0;
  check_logits(op, "exp_logits", exp_logits, n, vl);
  detail::require_f32(op, "loss", loss);
  MG_CHECK(loss.numel() == n, op, ": loss has ", loss.numel(), " elements for ", n, " rows");
  check_vec(op, "stats", stats, 3 * n, DType::F32);
  MG_CHECK(label_smoothing == 0.0f || vocab_size > 1, op, ": label smoothing needs vocab_size > 1");
  if (n == 0) return;
  loss_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
      loss.data<float>(), exp_logits.data<float>(), stats.data<float>(), n, vl, vocab_size,
      smoothing_weight(label_smoothing, vocab_size));
  MG_CUDA_LAUNCH_CHECK();
}

void vocab_parallel_xent_bwd(const Tensor& dlogits, const Tensor& softmax,
                             const Tensor& local_target, const Tensor& dloss, int64_t vocab_size,
                             float label_smoothing) {
  const char* op = "vocab_parallel_xent_bwd";
  int64_t n = 0, vl = 0;
  check_logits(op, "softmax", softmax, n, vl);
  detail::require_f32(op, "dlogits", dlogits);
  detail::require_same_numel(op, dlogits, softmax);
  check_vec(op, "local_target", local_target, n, DType::I64);
  check_vec(op, "dloss", dloss, n, DType::F32);
  MG_CHECK(label_smoothing == 0.0f || vocab_size > 1, op, ": label smoothing needs vocab_size > 1");
  if (n == 0) return;
  const double a = smoothing_weight(label_smoothing, vocab_size);
  xent_bwd_kernel<<<unsigned(n), kThreads, 0, stream()>>>(
      dlogits.data<float>(), softmax.data<float>(), local_target.data<int64_t>(),
      dloss.data<float>(), vl, float(1.0 - a), float(a / double(vocab_size)));
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
