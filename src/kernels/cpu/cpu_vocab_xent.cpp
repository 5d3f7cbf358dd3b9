// The per-row work of vocab-parallel cross entropy (Megatron's _VocabParallelCrossEntropy): row
// max, shifted exponentials with the target logit and the sums the group all-reduces, loss and
// softmax, and the backward with label smoothing. The collectives between the steps are the
// caller's (src/comm/vocab_parallel_cross_entropy.cpp). OpenMP over rows for large inputs.
#include <omp.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {
namespace {

// logits [n, Vl] -> (n, Vl).
void check_logits(const char* op, const char* name, const Tensor& logits, int64_t& n, int64_t& vl) {
  cpu::require_f32(op, name, logits);
  MG_CHECK(logits.dim() == 2, op, ": ", name, " must be [n, vocab shard], got ",
           shape_str(logits.shape()));
  n = logits.size(0);
  vl = logits.size(1);
}

void check_vec(const char* op, const char* name, const Tensor& t, int64_t n, DType dtype) {
  cpu::require_host(op, t);
  MG_CHECK(t.defined() && t.dtype() == dtype && t.is_contiguous() && t.numel() == n, op, ": ",
           name, " must be contiguous ", dtype_name(dtype), " [", n, "], got ",
           t.defined() ? shape_str(t.shape()) : std::string("undefined"));
}

// targets int32 or int64 [n], read as int64.
struct Targets {
  const int32_t* i32 = nullptr;
  const int64_t* i64 = nullptr;
  int64_t operator[](int64_t i) const { return i32 ? int64_t(i32[i]) : i64[i]; }
};
Targets read_targets(const char* op, const Tensor& t, int64_t n) {
  cpu::require_host(op, t);
  MG_CHECK(t.defined() && t.is_contiguous() && t.numel() == n, op, ": targets must be contiguous [",
           n, "]");
  if (t.dtype() == DType::I32) return {t.data<int32_t>(), nullptr};
  MG_CHECK(t.dtype() == DType::I64, op, ": targets must be int32 or int64, got ",
           dtype_name(t.dtype()));
  return {nullptr, t.data<int64_t>()};
}

// a = ls * V / (V - 1): Megatron's smoothing weight spread over the whole vocabulary.
double smoothing_weight(float label_smoothing, int64_t vocab) {
  return label_smoothing > 0 ? double(label_smoothing) * double(vocab) / double(vocab - 1) : 0.0;
}

}  // namespace

void vocab_parallel_xent_max(const Tensor& logits_max, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_size) {
  const char* op = "vocab_parallel_xent_max";
  int64_t n = 0, vl = 0;
  check_logits(op, "logits", logits, n, vl);
  check_vec(op, "logits_max", logits_max, n, DType::F32);
  const Targets tgt = read_targets(op, targets, n);
  const float* z = logits.data<float>();
  float* m = logits_max.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    MG_REQUIRE(tgt[i] >= 0 && tgt[i] < vocab_size, "cross entropy: target id ", tgt[i],
               " at token ", i, " is outside the vocabulary [0, ", vocab_size,
               "); check the tokenizer / --vocab-size of the data");
    float v = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vl; ++j) v = std::max(v, z[i * vl + j]);
    m[i] = v;
  }
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
  const Targets tgt = read_targets(op, targets, n);
  float* z = logits.data<float>();
  const float* m = logits_max.data<float>();
  float* pred = stats.data<float>();
  float* sexp = pred + n;
  float* szs = pred + 2 * n;
  int64_t* lt = local_target.data<int64_t>();
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float* row = z + i * vl;
    const int64_t t = tgt[i] - vocab_start;
    lt[i] = (t >= 0 && t < vl) ? t : -1;
    pred[i] = lt[i] >= 0 ? row[lt[i]] - m[i] : 0.0f;  // other ranks contribute 0
    float se = 0.0f, sz = 0.0f;
    for (int64_t j = 0; j < vl; ++j) {
      const float zj = row[j] - m[i];
      sz += zj;
      row[j] = std::exp(zj);
      se += row[j];
    }
    sexp[i] = se;
    szs[i] = sz;
  }
}

void vocab_parallel_xent_loss(const Tensor& loss, const Tensor& exp_logits, const Tensor& stats,
                              int64_t vocab_size, float label_smoothing) {
  const char* op = "vocab_parallel_xent_loss";
  int64_t n = 0, vl = 0;
  check_logits(op, "exp_logits", exp_logits, n, vl);
  cpu::require_f32(op, "loss", loss);
  MG_CHECK(loss.numel() == n, op, ": loss has ", loss.numel(), " elements for ", n, " rows");
  check_vec(op, "stats", stats, 3 * n, DType::F32);
  MG_CHECK(label_smoothing == 0.0f || vocab_size > 1, op, ": label smoothing needs vocab_size > 1");
  float* z = exp_logits.data<float>();
  const float* pred = stats.data<float>();
  const float* sexp = pred + n;
  const float* szs = pred + 2 * n;
  float* l = loss.data<float>();
  const double a = smoothing_weight(label_smoothing, vocab_size);
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float log_z = std::log(sexp[i]);
    float loss_i = log_z - pred[i];
    if (a > 0) {
      const double mean_log_p = double(szs[i]) / double(vocab_size) - double(log_z);
      loss_i = float((1.0 - a) * double(loss_i) - a * mean_log_p);
    }
    l[i] = loss_i;
    const float inv = 1.0f / sexp[i];
    for (int64_t j = 0; j < vl; ++j) z[i * vl + j] *= inv;
  }
}

void vocab_parallel_xent_bwd(const Tensor& dlogits, const Tensor& softmax,
                             const Tensor& local_target, const Tensor& dloss, int64_t vocab_size,
                             float label_smoothing) {
  const char* op = "vocab_parallel_xent_bwd";
  int64_t n = 0, vl = 0;
  check_logits(op, "softmax", softmax, n, vl);
  cpu::require_f32(op, "dlogits", dlogits);
  cpu::require_numel(op, dlogits, softmax);
  check_vec(op, "local_target", local_target, n, DType::I64);
  check_vec(op, "dloss", dloss, n, DType::F32);
  MG_CHECK(label_smoothing == 0.0f || vocab_size > 1, op, ": label smoothing needs vocab_size > 1");
  const float* gl = dloss.data<float>();
  const float* sm = softmax.data<float>();
  const int64_t* lt = local_target.data<int64_t>();
  const double a = smoothing_weight(label_smoothing, vocab_size);
  const float hit = float(1.0 - a), floor = float(a / double(vocab_size));
  for (int64_t i = 0; i < n; ++i)
    MG_CHECK(lt[i] >= -1 && lt[i] < vl, op, ": local_target[", i, "] = ", lt[i],
             " outside the shard [0, ", vl, ") (-1: another rank's)");
  float* d = dlogits.data<float>();
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < vl; ++j) d[i * vl + j] = (sm[i * vl + j] - floor) * gl[i];
    if (lt[i] >= 0) d[i * vl + lt[i]] -= hit * gl[i];
  }
}

}  // namespace megatron::ops::cpu
