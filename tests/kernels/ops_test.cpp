// Every CPU op against a double-precision reference on random inputs (tolerance
// atol + |ref| * 1e-5): GEMM, embedding, LayerNorm, GELU, bias/residual/scale, dropout,
// cross-entropy, AdamW, norms and casts. Attention has its own file.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernel_test_util.h"

namespace megatron::ops {
namespace {
using testing::expect_close;
using testing::randn;
using testing::to_double;

TEST(Ops, GemmAllTransposesAlphaBetaAndStridedViews) {
  const int64_t m = 37, n = 29, k = 41;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = ta ? randn({k, m}, 1) : randn({m, k}, 1);
      // b is a column block of a wider matrix (row stride != cols).
      Tensor wide = tb ? randn({n, k + 5}, 2) : randn({k, n + 5}, 2);
      Tensor b = tb ? wide.narrow(1, 2, k) : wide.narrow(1, 2, n);
      Tensor c = randn({m, n}, 3);
      auto A = to_double(a), C = to_double(c);
      std::vector<double> ref(size_t(m * n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            double av = ta ? A[size_t(p * m + i)] : A[size_t(i * k + p)];
            double bv = tb ? b.item_as_double(j * k + p) : b.item_as_double(p * n + j);
            s += av * bv;
          }
          ref[size_t(i * n + j)] = 0.7 * s + 0.3 * C[size_t(i * n + j)];
        }
      gemm(a, ta, b, tb, c, 0.7f, 0.3f);
      expect_close("gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb), c, ref, 1e-5);
    }
}

TEST(Ops, GemmBatched) {
  Tensor a = randn({3, 5, 7}, 4), b = randn({3, 6, 7}, 5), c = Tensor::zeros({3, 5, 6}, DType::F32);
  gemm_batched(a, false, b, true, c);
  std::vector<double> ref;
  for (int64_t z = 0; z < 3; ++z)
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 6; ++j) {
        double s = 0;
        for (int64_t p = 0; p < 7; ++p)
          s += a.item_as_double((z * 5 + i) * 7 + p) * b.item_as_double((z * 6 + j) * 7 + p);
        ref.push_back(s);
      }
  expect_close("gemm_batched", c, ref, 1e-5);
}

TEST(Ops, EmbeddingForwardBackwardDeterministic) {
  const int64_t V = 11, h = 6, n = 40;
  Tensor w = randn({V, h}, 6);
  std::vector<int32_t> idv(n);
  for (int64_t i = 0; i < n; ++i) idv[size_t(i)] = int32_t((i * 7) % V);
  Tensor ids = Tensor::from_vector(idv, {n});
  Tensor out = Tensor::empty({n, h}, DType::F32);
  embedding_fwd(out, ids, w);
  std::vector<double> ref;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j) ref.push_back(w.item_as_double(idv[size_t(i)] * h + j));
  expect_close("embedding_fwd", out, ref, 0, 0);
  Tensor g = randn({n, h}, 7);
  Tensor dw = randn({V, h}, 8);
  std::vector<double> dref = to_double(dw);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j) dref[size_t(idv[size_t(i)] * h + j)] += g.item_as_double(i * h + j);
  Tensor dw1 = dw.clone();
  omp_set_num_threads(1);
  embedding_bwd(dw1, ids, g);
  omp_set_num_threads(2);
  embedding_bwd(dw, ids, g);
  expect_close("embedding_bwd", dw, dref, 1e-6);
  EXPECT_EQ(dw.to_float_vector(), dw1.to_float_vector());  // thread-count independent
  idv[3] = int32_t(V);
  EXPECT_THROW(embedding_fwd(out, Tensor::from_vector(idv, {n}), w), Error);
}

// Vocab-parallel lookup: a shard [start, start + Vl) of the table gives the full table's rows for
// its ids and zero rows for the others; backward touches only its own rows.
TEST(Ops, VocabParallelEmbeddingMasksOtherShards) {
  const int64_t V = 12, h = 5, n = 30, start = 4, Vl = 4;
  Tensor w = randn({V, h}, 40);
  std::vector<int32_t> idv(n);
  for (int64_t i = 0; i < n; ++i) idv[size_t(i)] = int32_t((i * 5) % V);
  Tensor ids = Tensor::from_vector(idv, {n});
  Tensor shard = w.narrow(0, start, Vl).contiguous();
  Tensor out = Tensor::full({n, h}, 9.0, DType::F32);
  vocab_parallel_embedding_fwd(out, ids, shard, start);
  std::vector<double> ref;
  for (int64_t i = 0; i < n; ++i) {
    const bool mine = idv[size_t(i)] >= start && idv[size_t(i)] < start + Vl;
    for (int64_t j = 0; j < h; ++j)
      ref.push_back(mine ? w.item_as_double(idv[size_t(i)] * h + j) : 0.0);
  }
  expect_close("vocab_parallel_embedding_fwd", out, ref, 0, 0);
  Tensor g = randn({n, h}, 41);
  Tensor full_dw = Tensor::zeros({V, h}, DType::F32), dw = Tensor::zeros({Vl, h}, DType::F32);
  embedding_bwd(full_dw, ids, g);
  vocab_parallel_embedding_bwd(dw, ids, g, start);
  expect_close("vocab_parallel_embedding_bwd", dw,
               to_double(full_dw.narrow(0, start, Vl).contiguous()), 0, 0);
  // A bf16 or fp16 shard gives its stored values exactly, widened to fp32.
  for (DType dt : {DType::BF16, DType::F16}) {
    const Tensor half = shard.to(dt);
    Tensor got = Tensor::full({n, h}, 9.0, DType::F32), want = Tensor::full({n, h}, 9.0, DType::F32);
    vocab_parallel_embedding_fwd(got, ids, half, start);
    vocab_parallel_embedding_fwd(want, ids, half.to(DType::F32), start);
    expect_close(std::string("vocab_parallel_embedding_fwd ") + dtype_name(dt), got,
                 to_double(want), 0, 0);
  }
}

TEST(Ops, LayerNormForwardBackward) {
  const int64_t n = 13, h = 24;
  Tensor x = randn({n, h}, 9, 2.0f), w = randn({h}, 10), b = randn({h}, 11), g = randn({n, h}, 12);
  Tensor out = Tensor::empty({n, h}, DType::F32), mean = Tensor::empty({n}, DType::F32),
         rstd = Tensor::empty({n}, DType::F32);
  const float eps = 1e-5f;
  norm_fwd(NormId::layernorm, out, mean, rstd, x, w, b, eps);
  std::vector<double> ref, dx_ref(size_t(n * h)), dw_ref(static_cast<size_t>(h)), db_ref(static_cast<size_t>(h));
  for (int64_t i = 0; i < n; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mu += x.item_as_double(i * h + j);
    mu /= double(h);
    for (int64_t j = 0; j < h; ++j) var += std::pow(x.item_as_double(i * h + j) - mu, 2);
    var /= double(h);
    const double r = 1.0 / std::sqrt(var + eps);
    double sg = 0, sgx = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double xh = (x.item_as_double(i * h + j) - mu) * r;
      ref.push_back(xh * w.item_as_double(j) + b.item_as_double(j));
      const double gw = g.item_as_double(i * h + j) * w.item_as_double(j);
      sg += gw;
      sgx += gw * xh;
      dw_ref[size_t(j)] += g.item_as_double(i * h + j) * xh;
      db_ref[size_t(j)] += g.item_as_double(i * h + j);
    }
    for (int64_t j = 0; j < h; ++j) {
      const double xh = (x.item_as_double(i * h + j) - mu) * r;
      dx_ref[size_t(i * h + j)] =
          r * (g.item_as_double(i * h + j) * w.item_as_double(j) - sg / double(h) - xh * sgx / double(h));
    }
  }
  expect_close("layernorm_fwd", out, ref, 1e-5);
  Tensor dx = Tensor::empty({n, h}, DType::F32), dw = Tensor::zeros({h}, DType::F32),
         db = Tensor::zeros({h}, DType::F32);
  norm_bwd(NormId::layernorm, dx, dw, db, g, x, w, mean, rstd);
  expect_close("layernorm_bwd dx", dx, dx_ref, 1e-5);
  expect_close("layernorm_bwd dw", dw, dw_ref, 1e-5);
  expect_close("layernorm_bwd db", db, db_ref, 1e-5);
}

ActivationId gelu_kind(bool tanh_approx) {
  return tanh_approx ? ActivationId::gelu_tanh : ActivationId::gelu;
}

TEST(Ops, GeluTanhAndExact) {
  Tensor x = randn({1000}, 13, 3.0f), g = randn({1000}, 14);
  for (bool tanh_approx : {true, false}) {
    Tensor y = Tensor::empty({1000}, DType::F32), dx = Tensor::empty({1000}, DType::F32);
    activation_fwd(gelu_kind(tanh_approx), y, x);
    activation_bwd(gelu_kind(tanh_approx), dx, g, x);
    std::vector<double> yr, dr;
    for (int64_t i = 0; i < 1000; ++i) {
      const double v = x.item_as_double(i);
      auto f = [&](double u) {
        return tanh_approx ? 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)))
                           : 0.5 * u * (1 + std::erf(u / std::sqrt(2.0)));
      };
      yr.push_back(f(v));
      const double e = 1e-6;
      dr.push_back(g.item_as_double(i) * (f(v + e) - f(v - e)) / (2 * e));
    }
    expect_close(tanh_approx ? "gelu tanh fwd" : "gelu erf fwd", y, yr, 1e-6);
    expect_close(tanh_approx ? "gelu tanh bwd" : "gelu erf bwd", dx, dr, 1e-5, 1e-4);
  }
}

TEST(Ops, BiasResidualScale) {
  Tensor x = randn({9, 5}, 15), bias = randn({5}, 16), y = randn({9, 5}, 17);
  std::vector<double> xr = to_double(x);
  for (int64_t i = 0; i < 45; ++i) xr[size_t(i)] += bias.item_as_double(i % 5);
  bias_add(x, bias);
  expect_close("bias_add", x, xr, 1e-6);
  Tensor db = Tensor::full({5}, 1.0, DType::F32);
  std::vector<double> dbr(5, 1.0);
  for (int64_t i = 0; i < 45; ++i) dbr[size_t(i % 5)] += y.item_as_double(i);
  bias_grad(db, y);
  expect_close("bias_grad", db, dbr, 1e-6);
  Tensor s = Tensor::empty({9, 5}, DType::F32);
  add(s, x, y);
  std::vector<double> sr;
  for (int64_t i = 0; i < 45; ++i) sr.push_back(x.item_as_double(i) + y.item_as_double(i));
  expect_close("add", s, sr, 1e-6);
  scale(s, 0.25f);
  for (double& v : sr) v *= 0.25;
  expect_close("scale", s, sr, 1e-6);
}

TEST(Ops, DropoutMasksFromPhilox) {
  const int64_t n = 50000;
  Tensor x = randn({n}, 18), res = randn({n}, 19), bias = Tensor::zeros({1}, DType::F32);
  DropoutSpec d{0.25f, 77, 3};
  Tensor y = Tensor::empty({n}, DType::F32), y1 = Tensor::empty({n}, DType::F32);
  dropout_fwd(y, x, d);
  omp_set_num_threads(1);
  dropout_fwd(y1, x, d);
  omp_set_num_threads(2);
  EXPECT_EQ(y.to_float_vector(), y1.to_float_vector());
  Philox rng(77, 3);
  std::vector<double> ref;
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rng.uniform(uint64_t(i)) >= 0.25f;
    dropped += keep ? 0 : 1;
    ref.push_back(keep ? x.item_as_double(i) / 0.75 : 0.0);
  }
  expect_close("dropout_fwd", y, ref, 1e-6);
  EXPECT_NEAR(double(dropped) / double(n), 0.25, 0.01);
  Tensor dx = Tensor::empty({n}, DType::F32);
  dropout_bwd(dx, x, d);  // same mask, linear
  expect_close("dropout_bwd", dx, ref, 1e-6);
  // A shard starting at element k (element_offset = k) gets the slice [k, ...) of the mask.
  DropoutSpec shard_spec = d;
  shard_spec.element_offset = 12345;
  Tensor ys = Tensor::empty({n - 12345}, DType::F32);
  dropout_fwd(ys, x.narrow(0, 12345, n - 12345).contiguous(), shard_spec);
  EXPECT_EQ(ys.to_float_vector(), y.narrow(0, 12345, n - 12345).contiguous().to_float_vector());
  // bias-dropout-add: out = res + drop(x + b); backward dbias += colsum(drop(dout)).
  Tensor o = Tensor::empty({n, 1}, DType::F32);
  bias_dropout_add_fwd(o, x.view({n, 1}), bias, res.view({n, 1}), d);
  std::vector<double> oref;
  for (int64_t i = 0; i < n; ++i) oref.push_back(ref[size_t(i)] + res.item_as_double(i));
  expect_close("bias_dropout_add_fwd", o, oref, 1e-6);
  Tensor dxx = Tensor::empty({n, 1}, DType::F32), dbias = Tensor::zeros({1}, DType::F32);
  bias_dropout_add_bwd(dxx, dbias, x.view({n, 1}), d);
  double sum = 0;
  for (double v : ref) sum += v;
  expect_close("bias_dropout_add_bwd dbias", dbias, {sum}, 1e-3);
}

TEST(Ops, SoftmaxCrossEntropy) {
  const int64_t n = 17, V = 301;
  Tensor z = randn({n, V}, 20, 3.0f);
  std::vector<int32_t> lab(n);
  std::vector<float> mask(n);
  for (int64_t i = 0; i < n; ++i) {
    lab[size_t(i)] = int32_t((i * 37) % V);
    mask[size_t(i)] = i % 4 == 0 ? 0.0f : 1.0f;
  }
  std::vector<double> lref, gref;
  const double gs = 0.3;
  for (int64_t i = 0; i < n; ++i) {
    double mx = -1e30, se = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, z.item_as_double(i * V + j));
    for (int64_t j = 0; j < V; ++j) se += std::exp(z.item_as_double(i * V + j) - mx);
    const double lz = mx + std::log(se);
    lref.push_back(lz - z.item_as_double(i * V + lab[size_t(i)]));
    for (int64_t j = 0; j < V; ++j)
      gref.push_back(gs * mask[size_t(i)] *
                     (std::exp(z.item_as_double(i * V + j) - lz) - (j == lab[size_t(i)] ? 1 : 0)));
  }
  Tensor loss = Tensor::empty({n}, DType::F32);
  softmax_xent_fwd_bwd(z, loss, Tensor::from_vector(lab, {n}), Tensor::from_vector(mask, {n}),
                       float(gs), true);
  expect_close("xent loss", loss, lref, 1e-5);
  expect_close("xent dlogits", z, gref, 1e-7);
  lab[2] = int32_t(V);
  EXPECT_THROW(softmax_xent_fwd_bwd(z, loss, Tensor::from_vector(lab, {n}), Tensor(), 1, false),
               Error);
}

TEST(Ops, AdamWStep) {
  const int64_t n = 1000;
  Tensor p = randn({n}, 21), g = randn({n}, 22), m = randn({n}, 23, 0.1f), v = randn({n}, 24);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::abs(v.data<float>()[i]) * 0.01f;
  AdamWConfig c;
  c.lr = 3e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  c.step = 7;
  std::vector<double> pr, mr, vr;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g.item_as_double(i);
    const double mi = 0.9 * m.item_as_double(i) + 0.1 * gi;
    const double vi = 0.95 * v.item_as_double(i) + 0.05 * gi * gi;
    const double mh = mi / (1 - std::pow(0.9, 7)), vh = vi / (1 - std::pow(0.95, 7));
    const double pi = p.item_as_double(i);
    pr.push_back(pi - 3e-3 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * pi));
    mr.push_back(mi);
    vr.push_back(vi);
  }
  Tensor copy = Tensor::empty({n}, DType::BF16);
  adamw_step(p, g, m, v, copy, c);
  expect_close("adamw param", p, pr, 1e-6);
  expect_close("adamw exp_avg", m, mr, 1e-7);
  expect_close("adamw exp_avg_sq", v, vr, 1e-8);
  expect_close("adamw bf16 copy", copy, pr, 0, 1.0 / 128);
}

TEST(Ops, NormsFiniteCasts) {
  Tensor x = randn({777}, 25);
  double ref = 0;
  for (int64_t i = 0; i < 777; ++i) ref += x.item_as_double(i) * x.item_as_double(i);
  EXPECT_NEAR(l2_norm_squared(x), ref, 1e-9 * ref);
  EXPECT_TRUE(all_finite(x));
  for (DType t : {DType::BF16, DType::F16, DType::F64}) {
    Tensor h = Tensor::empty({777}, t), back = Tensor::empty({777}, DType::F32);
    cast(h, x);
    cast(back, h);
    expect_close(std::string("cast roundtrip ") + dtype_name(t), back, to_double(x), 0,
                 t == DType::BF16 ? 1.0 / 256 : t == DType::F16 ? 1.0 / 2048 : 0);
    EXPECT_TRUE(all_finite(h));
  }
  Tensor hb = Tensor::empty({777}, DType::BF16);
  x.data<float>()[100] = INFINITY;
  cast(hb, x);
  EXPECT_FALSE(all_finite(x));
  EXPECT_FALSE(all_finite(hb));
  x.data<float>()[100] = NAN;
  EXPECT_FALSE(all_finite(x));
}

}  // namespace
}  // namespace megatron::ops
