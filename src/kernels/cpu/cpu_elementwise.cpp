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
  require_f32("vocab_parallel_embedding_fwd", "out", out);
  require_f32("vocab_parallel_embedding_fwd", "weight", weight);
  cpu::require_host("vocab_parallel_embedding_fwd", ids);
  MG_CHECK(ids.dtype() == DType::I32 && ids.is_contiguous(),
           "vocab_parallel_embedding_fwd: ids must be contiguous int32");
  const int64_t n = ids.numel(), h = weight.size(1), V = weight.size(0);
  MG_CHECK(out.numel() == n * h, "vocab_parallel_embedding_fwd: out has ", out.numel(),
           " elements, want ", n * h);
  const int32_t* id = ids.data<int32_t>();
  const float* w = weight.data<float>();
  float* o = out.data<float>();
  cpu::parallel_for(n, n * h, [&](int64_t i) {
    const int64_t v = int64_t(id[i]) - vocab_start;
    if (v >= 0 && v < V)
      std::copy(w + v * h, w + (v + 1) * h, o + i * h);
    else
      std::fill(o + i * h, o + (i + 1) * h, 0.0f);
  });
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
void dropout_apply(float* out, const float* x, const float* bias, int64_t m, const float* res,
                   int64_t n, const DropoutSpec& d) {
  const Philox rng(d.seed, d.stream);
  constexpr int64_t kChunk = 4096;
  auto chunk = [&](int64_t c, std::vector<float>& keep) {
    const int64_t len = std::min(kChunk, n - c);
    if (d.active()) cpu::dropout_row(keep.data(), len, d.element_offset + uint64_t(c), rng, d.p);
    for (int64_t i = 0; i < len; ++i) {
      float v = x[c + i];
      if (bias) v += bias[(c + i) % m];
      if (d.active()) v *= keep[size_t(i)];
      if (res) v += res[c + i];
      out[c + i] = v;
    }
  };
  const size_t mask = d.active() ? size_t(kChunk) : 0;  // no mask without dropout
  if (n <= kMinParallelWork) {  // on this thread, outside any OpenMP region
    std::vector<float> keep(mask);
    for (int64_t c = 0; c < n; c += kChunk) chunk(c, keep);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> keep(mask);
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
