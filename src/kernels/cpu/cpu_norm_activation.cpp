// RMSNorm and the MLP activations of Llama-style models (SwiGLU, squared ReLU) on the CPU.
// OpenMP over rows (norms) or elements; row statistics in fp32 as LayerNorm's.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {

namespace {
// x [n, h] and weight [h] of a norm; returns h.
int64_t check_norm(const char* op, const Tensor& x, const Tensor& weight) {
  require_f32(op, "x", x);
  require_f32(op, "weight", weight);
  MG_CHECK(x.dim() >= 1 && weight.numel() == x.size(-1), op, ": weight has ", weight.numel(),
           " elements for rows of ", x.size(-1), " (x ", shape_str(x.shape()), ")");
  return x.size(-1);
}
void check_rows(const char* op, const char* name, const Tensor& t, int64_t n) {
  require_f32(op, name, t);
  MG_CHECK(t.numel() == n, op, ": ", name, " has ", t.numel(), " elements, want ", n);
}
}  // namespace

void rmsnorm_fwd(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                 float eps) {
  const char* op = "rmsnorm_fwd";
  const int64_t h = check_norm(op, x, weight), n = rows_of(x);
  check_rows(op, "out", out, n * h);
  if (rstd.defined()) check_rows(op, "rstd", rstd, n);
  const float *xp = x.data<float>(), *w = weight.data<float>();
  float* o = out.data<float>();
  float* rp = rstd.defined() ? rstd.data<float>() : nullptr;
  cpu::parallel_for(n, n * h, [&](int64_t i) {
    const float* xi = xp + i * h;
    float ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += xi[j] * xi[j];
    const float r = 1.0f / std::sqrt(ms / float(h) + eps);
    float* oi = o + i * h;
    for (int64_t j = 0; j < h; ++j) oi[j] = xi[j] * r * w[j];
    if (rp) rp[i] = r;
  });
}

void rmsnorm_bwd(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                 const Tensor& weight, const Tensor& rstd, bool accumulate_dx) {
  const char* op = "rmsnorm_bwd";
  const int64_t h = check_norm(op, x, weight), n = rows_of(x);
  check_rows(op, "dx", dx, n * h);
  check_rows(op, "dout", dout, n * h);
  check_rows(op, "dweight", dweight, h);
  check_rows(op, "rstd", rstd, n);
  MG_CHECK(!accumulate_dx || dx.raw_data() != dout.raw_data(), op,
           ": dx may not alias dout when accumulating");
  const float *xp = x.data<float>(), *w = weight.data<float>(), *g = dout.data<float>();
  const float* rp = rstd.data<float>();
  float *dxp = dx.data<float>(), *dw = dweight.data<float>();
  const int nt = omp_get_max_threads();
  std::vector<float> part(size_t(nt) * size_t(h), 0.0f);  // per-thread dweight partials
#pragma omp parallel
  {
    float* pdw = part.data() + size_t(omp_get_thread_num()) * size_t(h);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float *xi = xp + i * h, *gi = g + i * h;
      const float r = rp[i];
      // y = xhat * w with xhat = x r: dx = r (dy w - xhat mean(dy w xhat)).
      float sum_gx = 0;
      for (int64_t j = 0; j < h; ++j) {
        const float xh = xi[j] * r;
        sum_gx += gi[j] * w[j] * xh;
        pdw[j] += gi[j] * xh;
      }
      sum_gx /= float(h);
      float* dxi = dxp + i * h;
      for (int64_t j = 0; j < h; ++j) {
        const float v = r * (gi[j] * w[j] - xi[j] * r * sum_gx);
        dxi[j] = accumulate_dx ? dxi[j] + v : v;
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int64_t j = 0; j < h; ++j) dw[j] += part[size_t(t) * size_t(h) + size_t(j)];
}

namespace {
// 1 / (1 + e^-a), vectorisable; fast_exp's clamp keeps it finite for any a.
inline float sigmoid(float a) { return 1.0f / (1.0f + cpu::fast_exp(-a)); }

// x [n, 2f] and its half width f, for out / dout [n, f].
int64_t check_glu(const char* op, const Tensor& x, const Tensor& half, const char* half_name) {
  require_f32(op, "x", x);
  require_f32(op, half_name, half);
  MG_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x ", shape_str(x.shape()),
           " must have an even last dim ([gate | up])");
  const int64_t f = x.size(-1) / 2;
  MG_CHECK(half.numel() * 2 == x.numel(), op, ": ", half_name, " ", shape_str(half.shape()),
           " must have half the elements of x ", shape_str(x.shape()));
  return f;
}
}  // namespace

void swiglu_fwd(const Tensor& out, const Tensor& x) {
  const int64_t f = check_glu("swiglu_fwd", x, out, "out"), n = rows_of(x);
  const float* xp = x.data<float>();
  float* o = out.data<float>();
  cpu::parallel_for(n, n * f, [&](int64_t i) {
    const float *gate = xp + i * 2 * f, *up = gate + f;
    float* oi = o + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) oi[j] = gate[j] * sigmoid(gate[j]) * up[j];
  });
}

void swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "swiglu_bwd";
  const int64_t f = check_glu(op, x, dout, "dout"), n = rows_of(x);
  require_f32(op, "dx", dx);
  cpu::require_numel(op, dx, x);
  const float *xp = x.data<float>(), *g = dout.data<float>();
  float* d = dx.data<float>();
  cpu::parallel_for(n, n * f, [&](int64_t i) {
    const float *gate = xp + i * 2 * f, *up = gate + f, *gi = g + i * f;
    float *dgate = d + i * 2 * f, *dup = dgate + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float a = gate[j], s = sigmoid(a), silu = a * s;
      // silu'(a) = s (1 + a (1 - s))
      dgate[j] = gi[j] * up[j] * s * (1.0f + a * (1.0f - s));
      dup[j] = gi[j] * silu;
    }
  });
}

void squared_relu_fwd(const Tensor& out, const Tensor& x) {
  require_f32("squared_relu_fwd", "x", x);
  require_f32("squared_relu_fwd", "out", out);
  cpu::require_numel("squared_relu_fwd", out, x);
  const float* xp = x.data<float>();
  float* o = out.data<float>();
  const int64_t n = x.numel();
  cpu::parallel_for_simd(n, [&](int64_t i) {
    const float r = xp[i] > 0.0f ? xp[i] : 0.0f;
    o[i] = r * r;
  });
}

void squared_relu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  require_f32("squared_relu_bwd", "x", x);
  require_f32("squared_relu_bwd", "dx", dx);
  require_f32("squared_relu_bwd", "dout", dout);
  cpu::require_numel("squared_relu_bwd", dx, x);
  cpu::require_numel("squared_relu_bwd", dout, x);
  const float *xp = x.data<float>(), *g = dout.data<float>();
  float* d = dx.data<float>();
  const int64_t n = x.numel();
  cpu::parallel_for_simd(n, [&](int64_t i) { d[i] = xp[i] > 0.0f ? 2.0f * xp[i] * g[i] : 0.0f; });
}

}  // namespace megatron::ops::cpu
