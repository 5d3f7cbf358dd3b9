// The norms over the last dim on the CPU (ops::norm_fwd / norm_bwd): one NormKernel<id> per kind
// of kernels/op_kinds.h, chosen once per call. OpenMP over rows; row statistics in fp32 (two-pass
// mean and variance for LayerNorm); the weight (and bias) gradients summed per thread, then in
// thread order, so results do not depend on scheduling.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace megatron::ops::cpu {

namespace {


// The arguments of a norm's kernels, checked by norm_fwd / norm_bwd (pointers are null for
// undefined tensors). The forward's output is the kernel's `o` (fp32, or bf16 through cpu::put).
struct NormFwdArgs {
  int64_t n, h;
  const float *x, *w, *b;
  float *mean, *rstd;
  float eps;
};
struct NormBwdArgs {
  int64_t n, h;
  const float *x, *w, *dout, *mean, *rstd;
  float *dx, *dw, *db;
  bool accumulate_dx;
};

// The kernel of norm kind K: static fwd(const NormFwdArgs&, O* out) for O fp32 or bf16, and
// bwd(const NormBwdArgs&).
template <NormId K>
struct NormKernel;

template <>
struct NormKernel<NormId::layernorm> {
  template <class O>
  static void fwd(const NormFwdArgs& a, O* o) {
    const int64_t h = a.h, n = a.n;
    const float *xp = a.x, *w = a.w, *b = a.b;
    float *mp = a.mean, *rp = a.rstd;
    const float eps = a.eps;
    cpu::parallel_for(n, n * h, [&](int64_t i) {
      const float* xi = xp + i * h;
      float m = 0;
      for (int64_t j = 0; j < h; ++j) m += xi[j];
      m /= float(h);
      float v = 0;
      for (int64_t j = 0; j < h; ++j) v += (xi[j] - m) * (xi[j] - m);
      v /= float(h);
      const float r = 1.0f / std::sqrt(v + eps);
      O* oi = o + i * h;
      for (int64_t j = 0; j < h; ++j) cpu::put(oi + j, (xi[j] - m) * r * w[j] + b[j]);
      if (mp) mp[i] = m;
      if (rp) rp[i] = r;
    });
  }
  static void bwd(const NormBwdArgs& a) {
    const int64_t h = a.h, n = a.n;
    const float *xp = a.x, *w = a.w, *g = a.dout, *mp = a.mean, *rp = a.rstd;
    float *dxp = a.dx, *dw = a.dw, *db = a.db;
    const bool accumulate_dx = a.accumulate_dx;
    const int nt = omp_get_max_threads();
    std::vector<float> part(size_t(nt) * 2 * size_t(h), 0.0f);  // per-thread dw, db partials
#pragma omp parallel
    {
      const int tid = omp_get_thread_num();
      float* pdw = part.data() + size_t(tid) * 2 * h;
      float* pdb = pdw + h;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float *xi = xp + i * h, *gi = g + i * h;
        const float m = mp[i], r = rp[i];
        float sum_g = 0, sum_gx = 0;  // sums of dy*w and dy*w*xhat
        for (int64_t j = 0; j < h; ++j) {
          const float xh = (xi[j] - m) * r, gw = gi[j] * w[j];
          sum_g += gw;
          sum_gx += gw * xh;
          pdw[j] += gi[j] * xh;
          pdb[j] += gi[j];
        }
        sum_g /= float(h);
        sum_gx /= float(h);
        float* dxi = dxp + i * h;
        for (int64_t j = 0; j < h; ++j) {
          const float xh = (xi[j] - m) * r;
          const float v = r * (gi[j] * w[j] - sum_g - xh * sum_gx);
          dxi[j] = accumulate_dx ? dxi[j] + v : v;
        }
      }
    }
    for (int t = 0; t < nt; ++t)
      for (int64_t j = 0; j < h; ++j) {
        dw[j] += part[size_t(t) * 2 * h + j];
        db[j] += part[size_t(t) * 2 * h + h + j];
      }
  }
};

template <>
struct NormKernel<NormId::rmsnorm> {
  template <class O>
  static void fwd(const NormFwdArgs& a, O* o) {
    const int64_t h = a.h, n = a.n;
    const float *xp = a.x, *w = a.w;
    float* rp = a.rstd;
    const float eps = a.eps;
    cpu::parallel_for(n, n * h, [&](int64_t i) {
      const float* xi = xp + i * h;
      float ms = 0;
      for (int64_t j = 0; j < h; ++j) ms += xi[j] * xi[j];
      const float r = 1.0f / std::sqrt(ms / float(h) + eps);
      O* oi = o + i * h;
      for (int64_t j = 0; j < h; ++j) cpu::put(oi + j, xi[j] * r * w[j]);
      if (rp) rp[i] = r;
    });
  }
  static void bwd(const NormBwdArgs& a) {
    const int64_t h = a.h, n = a.n;
    const float *xp = a.x, *w = a.w, *g = a.dout, *rp = a.rstd;
    float *dxp = a.dx, *dw = a.dw;
    const bool accumulate_dx = a.accumulate_dx;
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
};

// ---- argument checks shared by every kind ------------------------------------------------------

// An fp32 tensor of n elements (when `required` or defined); its data, or nullptr.
template <class T>
T* f32_of(const char* op, const char* name, const Tensor& t, int64_t n, bool required) {
  if (!required && !t.defined()) return nullptr;
  require_f32(op, name, t);
  MG_CHECK(t.numel() == n, op, ": ", name, " has ", t.numel(), " elements, want ", n);
  return t.data<float>();
}

// The kind's row, and x [n, h] with weight [h]; a bias exactly when the kind has one, a saved
// mean only when it keeps one.
const NormOp& check_norm(const char* op, NormId kind, const Tensor& x,
                                  const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                  int64_t* n, int64_t* h) {
  const NormOp* k = find_norm_op(kind);
  if (k == nullptr) detail::throw_no_kind_kernel(op, kind, x.device());
  require_f32(op, "x", x);
  MG_CHECK(x.dim() >= 1, op, ": x must have at least one dim");
  *h = x.size(-1);
  *n = rows_of(x);
  require_f32(op, "weight", weight);
  MG_CHECK(weight.numel() == *h, op, ": weight has ", weight.numel(), " elements for rows of ",
           *h, " (x ", shape_str(x.shape()), ")");
  MG_CHECK(bias.defined() == k->has_bias, op, ": ", k->name,
           k->has_bias ? " needs a bias" : " has no bias");
  MG_CHECK(!mean.defined() || k->saves_mean, op, ": ", k->name, " saves no mean");
  return *k;
}

}  // namespace

void norm_fwd(NormId kind, const Tensor& out, const Tensor& mean, const Tensor& rstd,
              const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "norm_fwd";
  int64_t n = 0, h = 0;
  check_norm(op, kind, x, weight, bias, mean, &n, &h);
  const NormFwdArgs a{n, h, x.data<float>(), weight.data<float>(),
                      f32_of<const float>(op, "bias", bias, h, false),
                      f32_of<float>(op, "mean", mean, n, false),
                      f32_of<float>(op, "rstd", rstd, n, false), eps};
  auto run = [&](auto* o) {
    cpu::with_kind<kNormOpCount>(op, kind, [&]<NormId K>() { NormKernel<K>::fwd(a, o); });
  };
  if (out.defined() && out.dtype() == DType::BF16) {
    require_bf16_output(op, out, x, n * h);
    run(out.data<bf16>());
  } else {
    run(f32_of<float>(op, "out", out, n * h, true));
  }
}

void norm_bwd(NormId kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
              const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
              const Tensor& rstd, bool accumulate_dx) {
  const char* op = "norm_bwd";
  int64_t n = 0, h = 0;
  const NormOp& k = check_norm(op, kind, x, weight, dbias, mean, &n, &h);
  MG_CHECK(!accumulate_dx || dx.raw_data() != dout.raw_data(), op,
           ": dx may not alias dout when accumulating");
  const NormBwdArgs a{n, h, x.data<float>(), weight.data<float>(),
                      f32_of<const float>(op, "dout", dout, n * h, true),
                      f32_of<const float>(op, "mean", mean, n, k.saves_mean),
                      f32_of<const float>(op, "rstd", rstd, n, true),
                      f32_of<float>(op, "dx", dx, n * h, true),
                      f32_of<float>(op, "dweight", dweight, h, true),
                      f32_of<float>(op, "dbias", dbias, h, false), accumulate_dx};
  cpu::with_kind<kNormOpCount>(op, kind, [&]<NormId K>() { NormKernel<K>::bwd(a); });
}

}  // namespace megatron::ops::cpu
