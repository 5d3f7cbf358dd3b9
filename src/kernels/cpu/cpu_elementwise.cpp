// Row-wise and element-wise CPU ops: embedding, bias, residual, dropout, scale. OpenMP over rows.
// (The norms are in cpu_norm.cpp, the activations in cpu_activation.cpp.)
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {

void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight) {
  require_f32("embedding_fwd", "out", out);
  require_f32("embedding_fwd", "weight", weight);
  cpu::require_host("embedding_fwd", ids);
  MG_CHECK(ids.dtype() == DType::I32 && ids.is_contiguous(), "embedding_fwd: ids must be int32");
  const int64_t n = ids.numel(), h = weight.size(1), V = weight.size(0);
  MG_CHECK(out.numel() == n * h, "embedding_fwd: out has ", out.numel(), " elements, want ", n * h);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    MG_REQUIRE(id[i] >= 0 && id[i] < V, "embedding index ", id[i], " at position ", i,
               " is outside the table [0, ", V, ")");
  const float* w = weight.data<float>();
  float* o = out.data<float>();
  cpu::parallel_for(n, n * h, [&](int64_t i) { std::copy(w + id[i] * h, w + (id[i] + 1) * h, o + i * h); });
}

void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout) {
  require_f32("embedding_bwd", "dweight", dweight);
  require_f32("embedding_bwd", "dout", dout);
  const int64_t n = ids.numel(), h = dweight.size(1), V = dweight.size(0);
  MG_CHECK(dout.numel() == n * h, "embedding_bwd: dout size");
  const int32_t* id = ids.data<int32_t>();
  const float* g = dout.data<float>();
  float* dw = dweight.data<float>();
  // Each thread owns the vocabulary rows id % nthreads == tid and walks tokens in order, so the
  // summation order per row is fixed (deterministic) whatever the thread count.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = id[i];
      MG_CHECK(v >= 0 && v < V, "embedding_bwd: id out of range");
      if (v % nt != tid) continue;
      float* row = dw + int64_t(v) * h;
      const float* gi = g + i * h;
      for (int64_t j = 0; j < h; ++j) row[j] += gi[j];
    }
  }
}

void vocab_parallel_embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight,
                                  int64_t vocab_start) {
  const char* op = "vocab_parallel_embedding_fwd";
  require_f32(op, "out", out);
  cpu::require_host(op, weight);
  MG_CHECK(weight.defined() && weight.is_contiguous() && weight.dim() == 2, op,
           ": weight must be a contiguous [V, h] table");
  cpu::require_host(op, ids);
  MG_CHECK(ids.dtype() == DType::I32 && ids.is_contiguous(), op, ": ids must be contiguous int32");
  const int64_t n = ids.numel(), h = weight.size(1), V = weight.size(0);
  MG_CHECK(out.numel() == n * h, op, ": out has ", out.numel(), " elements, want ", n * h);
  const int32_t* id = ids.data<int32_t>();
  float* o = out.data<float>();
  auto lookup = [&](const auto* w) {
    cpu::parallel_for(n, n * h, [&](int64_t i) {
      const int64_t v = int64_t(id[i]) - vocab_start;
      float* row = o + i * h;
      if (v >= 0 && v < V) {
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) row[j] = to_f32(w[v * h + j]);
      } else {
        std::fill(row, row + h, 0.0f);
      }
    });
  };
  switch (weight.dtype()) {
    case DType::F32: return lookup(weight.data<float>());
    case DType::BF16: return lookup(weight.data<bf16>());
    case DType::F16: return lookup(weight.data<fp16>());
    default: MG_CHECK(false, op, ": weight must be float32, bfloat16 or float16, got ",
                      dtype_name(weight.dtype()));
  }
}

void vocab_parallel_embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                                  int64_t vocab_start) {
  require_f32("vocab_parallel_embedding_bwd", "dweight", dweight);
  require_f32("vocab_parallel_embedding_bwd", "dout", dout);
  const int64_t n = ids.numel(), h = dweight.size(1), V = dweight.size(0);
  MG_CHECK(dout.numel() == n * h, "vocab_parallel_embedding_bwd: dout size");
  const int32_t* id = ids.data<int32_t>();
  const float* g = dout.data<float>();
  float* dw = dweight.data<float>();
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = int64_t(id[i]) - vocab_start;
      if (v < 0 || v >= V || v % nt != tid) continue;
      float* row = dw + v * h;
      const float* gi = g + i * h;
      for (int64_t j = 0; j < h; ++j) row[j] += gi[j];
    }
  }
}

void bias_add(const Tensor& x, const Tensor& bias) {
  require_f32("bias_add", "x", x);
  require_f32("bias_add", "bias", bias);
  const int64_t m = bias.numel(), n = x.numel() / m;
  MG_CHECK(x.size(-1) == m, "bias_add: last dim ", x.size(-1), " != bias ", m);
  float* xp = x.data<float>();
  const float* b = bias.data<float>();
  cpu::parallel_for(n, n * m, [&](int64_t i) {
    for (int64_t j = 0; j < m; ++j) xp[i * m + j] += b[j];
  });
}

void bias_grad(const Tensor& dbias, const Tensor& dout) {
  require_f32("bias_grad", "dbias", dbias);
  require_f32("bias_grad", "dout", dout);
  const int64_t m = dbias.numel(), n = dout.numel() / m;
  MG_CHECK(dout.size(-1) == m, "bias_grad: last dim mismatch");
  const float* g = dout.data<float>();
  float* db = dbias.data<float>();
  // Columns split across threads: each column's sum runs over rows in order (deterministic).
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t c0 = m * tid / nt, c1 = m * (tid + 1) / nt;
    std::vector<double> acc(size_t(c1 - c0), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = c0; j < c1; ++j) acc[size_t(j - c0)] += g[i * m + j];
    for (int64_t j = c0; j < c1; ++j) db[j] += float(acc[size_t(j - c0)]);
  }
}

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  require_f32("add", "out", out);
  cpu::require_numel("add", out, a);
  cpu::require_numel("add", out, b);
  float* o = out.data<float>();
  const float *ap = a.data<float>(), *bp = b.data<float>();
  const int64_t n = out.numel();
  cpu::parallel_for_simd(n, [&](int64_t i) { o[i] = ap[i] + bp[i]; });
}

void scale(const Tensor& x, float s) {
  require_f32("scale", "x", x);
  float* p = x.data<float>();
  const int64_t n = x.numel();
  cpu::parallel_for_simd(n, [&](int64_t i) { p[i] *= s; });
}

void tanh_fwd(const Tensor& out, const Tensor& x) {
  require_f32("tanh_fwd", "x", x);
  require_f32("tanh_fwd", "out", out);
  cpu::require_numel("tanh_fwd", out, x);
  float* o = out.data<float>();
  const float* p = x.data<float>();
  cpu::parallel_for(x.numel(), x.numel(), [&](int64_t i) { o[i] = std::tanh(p[i]); });
}

void tanh_bwd(const Tensor& dx, const Tensor& dout, const Tensor& out) {
  require_f32("tanh_bwd", "dout", dout);
  require_f32("tanh_bwd", "out", out);
  require_f32("tanh_bwd", "dx", dx);
  cpu::require_numel("tanh_bwd", dout, out);
  cpu::require_numel("tanh_bwd", dx, out);
  float* d = dx.data<float>();
  const float *g = dout.data<float>(), *y = out.data<float>();
  cpu::parallel_for_simd(out.numel(), [&](int64_t i) { d[i] = g[i] * (1.0f - y[i] * y[i]); });
}

namespace {
// Applies out[i] = (x[i] + bias[i % m]) * keep[i] (+ residual[i]) in chunks of the Philox stream.
// Without dropout (p = 0) no mask is drawn: in place without bias and residual nothing is done,
// else one vectorised pass (x + bias) + residual, in the order of the masked loop below.
void add_bias_residual(float* out, const float* x, const float* bias, int64_t m,
                       const float* res, int64_t n) {
  if (bias == nullptr && res == nullptr) {
    if (out != x) cpu::parallel_for_simd(n, [&](int64_t i) { out[i] = x[i]; });
    return;
  }
  if (bias == nullptr) {
    cpu::parallel_for_simd(n, [&](int64_t i) { out[i] = x[i] + res[i]; });
    return;
  }
  cpu::parallel_for(n / m, n, [&](int64_t r) {
    float* o = out + r * m;
    const float* xr = x + r * m;
    const float* rr = res ? res + r * m : nullptr;
    if (rr) {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) o[j] = (xr[j] + bias[j]) + rr[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) o[j] = xr[j] + bias[j];
    }
  });
}

void dropout_apply(float* out, const float* x, const float* bias, int64_t m, const float* res,
                   int64_t n, const DropoutSpec& d) {
  if (!d.active()) {
    add_bias_residual(out, x, bias, m, res, n);
    return;
  }
  const Philox rng(d.seed, d.stream);
  constexpr int64_t kChunk = 4096;
  auto chunk = [&](int64_t c, std::vector<float>& keep) {
    const int64_t len = std::min(kChunk, n - c);
    cpu::dropout_row(keep.data(), len, d.element_offset + uint64_t(c), rng, d.p);
    for (int64_t i = 0; i < len; ++i) {
      float v = x[c + i];
      if (bias) v += bias[(c + i) % m];
      v *= keep[size_t(i)];
      if (res) v += res[c + i];
      out[c + i] = v;
    }
  };
  if (n <= kMinParallelWork) {  // on this thread, outside any OpenMP region
    std::vector<float> keep(kChunk);
    for (int64_t c = 0; c < n; c += kChunk) chunk(c, keep);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> keep(kChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) chunk(c, keep);
  }
}
}  // namespace

void dropout_fwd(const Tensor& out, const Tensor& x, const DropoutSpec& d) {
  require_f32("dropout_fwd", "out", out);
  require_f32("dropout_fwd", "x", x);
  cpu::require_numel("dropout_fwd", out, x);
  MG_CHECK(d.p >= 0.0f && d.p < 1.0f, "dropout probability ", d.p, " outside [0, 1)");
  dropout_apply(out.data<float>(), x.data<float>(), nullptr, 1, nullptr, x.numel(), d);
}

void dropout_bwd(const Tensor& dx, const Tensor& dout, const DropoutSpec& d) {
  cpu::dropout_fwd(dx, dout, d);  // the mask is linear: backward applies the same keep/scale
}

void bias_dropout_add_fwd(const Tensor& out, const Tensor& x, const Tensor& bias,
                          const Tensor& residual, const DropoutSpec& d) {
  require_f32("bias_dropout_add_fwd", "out", out);
  require_f32("bias_dropout_add_fwd", "x", x);
  require_f32("bias_dropout_add_fwd", "residual", residual);
  cpu::require_numel("bias_dropout_add_fwd", out, x);
  cpu::require_numel("bias_dropout_add_fwd", out, residual);
  const float* b = nullptr;
  int64_t m = 1;
  if (bias.defined()) {
    require_f32("bias_dropout_add_fwd", "bias", bias);
    m = bias.numel();
    MG_CHECK(x.size(-1) == m, "bias_dropout_add_fwd: bias size mismatch");
    b = bias.data<float>();
  }
  dropout_apply(out.data<float>(), x.data<float>(), b, m, residual.data<float>(), x.numel(), d);
}

void bias_dropout_add_bwd(const Tensor& dx, const Tensor& dbias, const Tensor& dout,
                          const DropoutSpec& d) {
  cpu::dropout_fwd(dx, dout, d);
  if (dbias.defined()) cpu::bias_grad(dbias, dx);
}

}  // namespace megatron::ops::cpu
