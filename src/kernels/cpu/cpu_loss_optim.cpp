// Fused softmax cross-entropy (per-token loss, dlogits written in place), AdamW with decoupled
// weight decay (one vectorised, threaded pass that also writes the bf16/fp16 model weights), SGD
// with momentum, the finite check and casts over any float dtype.
#include <omp.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/fused_optim.h"

namespace megatron::ops::cpu {

void softmax_xent_fwd_bwd(const Tensor& logits, const Tensor& loss, const Tensor& labels,
                          const Tensor& loss_mask, float grad_scale, bool write_grad) {
  cpu::require_host("softmax_xent", logits);
  MG_CHECK(logits.dim() == 2 && logits.dtype() == DType::F32 && logits.stride(1) == 1,
           "softmax_xent: logits must be 2-D float32 with unit inner stride");
  cpu::require_f32("softmax_xent", "loss", loss);
  const int64_t n = logits.size(0), V = logits.size(1), ld = logits.stride(0);
  MG_CHECK(labels.dtype() == DType::I32 && labels.numel() == n && loss.numel() == n,
           "softmax_xent: labels int32 [n] and loss [n] required");
  const int32_t* lab = labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    MG_REQUIRE(lab[i] >= 0 && lab[i] < V, "label ", lab[i], " at position ", i,
               " is outside the vocabulary [0, ", V, ")");
  const float* mask = nullptr;
  if (loss_mask.defined()) {
    cpu::require_f32("softmax_xent", "loss_mask", loss_mask);
    MG_CHECK(loss_mask.numel() == n, "softmax_xent: loss_mask must be [n]");
    mask = loss_mask.data<float>();
  }
  float* z = logits.data<float>();
  float* lp = loss.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* row = z + i * ld;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    const float zl = row[lab[i]];
    float sum = 0;
    if (write_grad) {  // keep exp(z - max) in the row, then scale it into the gradient
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        const float e = cpu::fast_exp(row[j] - mx);
        row[j] = e;
        sum += e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += cpu::fast_exp(row[j] - mx);
    }
    lp[i] = mx + std::log(sum) - zl;
    if (write_grad) {
      const float g = grad_scale * (mask ? mask[i] : 1.0f);
      const float gs = g / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) row[j] *= gs;
      row[lab[i]] -= g;
    }
  }
}

namespace {
// The AdamW update of elements [0, n) (the formula of ops.h, in its order of operations) on the
// gradient times gs (exact at 1), writing the updated value to `copy` too when it is given
// (bf16/fp16 model weights in the same pass).
template <class Copy>
void adamw_update(float* p, float* m, float* v, const float* g, float gs, Copy* copy, int64_t n,
                  const AdamWConfig& c, float bc1, float bc2) {
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = c.weight_decay, lr = c.lr;
  cpu::parallel_for_simd(n, [&](int64_t i) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] - lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * p[i]);
    p[i] = pi;
    if constexpr (std::is_same_v<Copy, bf16>) copy[i] = float_to_bf16(pi);
    if constexpr (std::is_same_v<Copy, fp16>) copy[i] = float_to_fp16(pi);
  });
}
}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& c) {
  cpu::adamw_step_scaled(master, grad, exp_avg, exp_avg_sq, model_copy, c, 1.0f);
}

void adamw_step_scaled(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& c,
                       float gs) {
  cpu::require_f32("adamw_step", "master", master);
  cpu::require_f32("adamw_step", "grad", grad);
  cpu::require_f32("adamw_step", "exp_avg", exp_avg);
  cpu::require_f32("adamw_step", "exp_avg_sq", exp_avg_sq);
  cpu::require_numel("adamw_step", master, grad);
  cpu::require_numel("adamw_step", master, exp_avg);
  cpu::require_numel("adamw_step", master, exp_avg_sq);
  MG_CHECK(c.step >= 1, "adamw_step: step must be >= 1");
  const int64_t n = master.numel();
  float *p = master.data<float>(), *m = exp_avg.data<float>(), *v = exp_avg_sq.data<float>();
  const float* g = grad.data<float>();
  const float bc1 = 1.0f - float(std::pow(double(c.beta1), double(c.step)));
  const float bc2 = 1.0f - float(std::pow(double(c.beta2), double(c.step)));
  const bool copy = model_copy.defined() && model_copy.raw_data() != master.raw_data();
  if (copy) {
    cpu::require_host("adamw_step", model_copy);
    cpu::require_numel("adamw_step", master, model_copy);
    MG_CHECK(model_copy.is_contiguous(), "adamw_step: model_copy must be contiguous");
  }
  const DType dt = copy ? model_copy.dtype() : DType::F32;
  if (copy && dt == DType::BF16)
    adamw_update(p, m, v, g, gs, model_copy.data<bf16>(), n, c, bc1, bc2);
  else if (copy && dt == DType::F16)
    adamw_update(p, m, v, g, gs, model_copy.data<fp16>(), n, c, bc1, bc2);
  else
    adamw_update(p, m, v, g, gs, static_cast<float*>(nullptr), n, c, bc1, bc2);
  if (copy && dt != DType::BF16 && dt != DType::F16) cast(model_copy, master);
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
              float weight_decay, float momentum, bool first_step) {
  cpu::require_f32("sgd_step", "param", param);
  cpu::require_f32("sgd_step", "grad", grad);
  cpu::require_f32("sgd_step", "momentum_buf", momentum_buf);
  cpu::require_numel("sgd_step", param, grad);
  cpu::require_numel("sgd_step", param, momentum_buf);
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* b = momentum_buf.data<float>();
  const int64_t n = param.numel();
  const bool fresh = momentum == 0.0f || first_step;  // the buffer starts as the gradient
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] + weight_decay * p[i];
    float bi = fresh ? gi : momentum * b[i] + gi;
    b[i] = bi;
    p[i] -= lr * bi;
  }
}

namespace {
template <typename F>
void for_each_float(const char* op, const Tensor& x, F&& f) {
  cpu::require_host(op, x);
  MG_CHECK(x.is_contiguous(), op, ": tensor must be contiguous");
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::F32: f(x.data<float>(), n, [](float v) { return v; }); break;
    case DType::F64: f(x.data<double>(), n, [](double v) { return float(v); }); break;
    case DType::BF16: f(x.data<bf16>(), n, [](bf16 v) { return bf16_to_float(v); }); break;
    case DType::F16: f(x.data<fp16>(), n, [](fp16 v) { return fp16_to_float(v); }); break;
    default: MG_CHECK(false, op, ": not a float dtype: ", dtype_name(x.dtype()));
  }
}
}  // namespace

namespace {
// True if any of the n values has an all-ones exponent (Inf or NaN): a test of the bits, so
// every dtype's loop is a vectorised OR.
template <class Bits>
bool any_nonfinite(const Bits* p, int64_t n, Bits exponent) {
  int bad = 0;
  if (n > kMinParallelWork) {
#pragma omp parallel for simd reduction(| : bad) schedule(static)
    for (int64_t i = 0; i < n; ++i) bad |= (p[i] & exponent) == exponent ? 1 : 0;
  } else {
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; ++i) bad |= (p[i] & exponent) == exponent ? 1 : 0;
  }
  return bad != 0;
}
}  // namespace

bool all_finite(const Tensor& x) {
  cpu::require_host("all_finite", x);
  MG_CHECK(x.is_contiguous(), "all_finite: tensor must be contiguous");
  const int64_t n = x.numel();
  const void* p = x.raw_data();
  switch (x.dtype()) {
    case DType::F32: return !any_nonfinite(static_cast<const uint32_t*>(p), n, 0x7f800000u);
    case DType::F64:
      return !any_nonfinite(static_cast<const uint64_t*>(p), n, uint64_t(0x7ff0000000000000ull));
    case DType::BF16: return !any_nonfinite(static_cast<const uint16_t*>(p), n, uint16_t(0x7f80));
    case DType::F16: return !any_nonfinite(static_cast<const uint16_t*>(p), n, uint16_t(0x7c00));
    default: MG_CHECK(false, "all_finite: not a float dtype: ", dtype_name(x.dtype()));
  }
  return false;  // not reached
}

void cast(const Tensor& dst, const Tensor& src) {
  cpu::require_host("cast", dst);
  cpu::require_numel("cast", dst, src);
  MG_CHECK(dst.is_contiguous(), "cast: destination must be contiguous");
  const int64_t n = src.numel();
  if (dst.dtype() == DType::F64) {
    double* d = dst.data<double>();
    for_each_float("cast", src, [&](auto* p, int64_t m, auto conv) {
      if constexpr (std::is_same_v<std::remove_const_t<std::remove_pointer_t<decltype(p)>>, double>)
        std::copy(p, p + m, d);
      else
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; ++i) d[i] = double(conv(p[i]));
    });
    return;
  }
  for_each_float("cast", src, [&](auto* p, int64_t m, auto conv) {
    (void)n;
    switch (dst.dtype()) {
      case DType::F32: {
        float* d = dst.data<float>();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; ++i) d[i] = conv(p[i]);
        break;
      }
      case DType::BF16: {
        bf16* d = dst.data<bf16>();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; ++i) d[i] = float_to_bf16(conv(p[i]));
        break;
      }
      case DType::F16: {
        fp16* d = dst.data<fp16>();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; ++i) d[i] = float_to_fp16(conv(p[i]));
        break;
      }
      default: MG_CHECK(false, "cast: unsupported destination ", dtype_name(dst.dtype()));
    }
  });
}

}  // namespace megatron::ops::cpu
