// Row gather / scatter, flat-buffer packing, double sums, matrix-vector GEMM, SGD and the
// vocab-parallel cross-entropy steps against references written here (plain loops in double),
// with strided views, other dtypes, duplicates, one row, thread-count independence and argument
// errors.
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

Tensor ints(const std::vector<int32_t>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }

TEST(Rows, IndexSelectFromStridedColumns) {
  // in: columns [2, 7) of a [6, 9] matrix (row stride 9).
  Tensor wide = randn({6, 9}, 501);
  Tensor in = wide.narrow(1, 2, 5);
  const std::vector<int32_t> ix{5, 0, 5, 3};
  Tensor out = Tensor::empty({4, 5}, DType::F32);
  index_select_rows(out, in, ints(ix));
  std::vector<double> ref;
  for (int32_t r : ix)
    for (int64_t c = 0; c < 5; ++c) ref.push_back(wide.item_as_double(r * 9 + 2 + c));
  expect_close("index_select_rows", out, ref, 0, 0);
  // Into a strided out, int32 payload.
  Tensor tok = Tensor::from_vector(std::vector<int32_t>{10, 11, 12, 13, 14, 15}, {3, 2});
  Tensor dst = Tensor::zeros({2, 5}, DType::I32);
  index_select_rows(dst.narrow(1, 1, 2), tok, ints({2, 0}));
  const std::vector<int32_t> want{0, 14, 15, 0, 0, 0, 10, 11, 0, 0};
  EXPECT_EQ(std::vector<int32_t>(dst.data<int32_t>(), dst.data<int32_t>() + 10), want);
}

TEST(Rows, IndexCopyWritesAndAccumulates) {
  Tensor in = randn({4, 3}, 502);
  Tensor out = randn({6, 3}, 503);
  std::vector<double> ref = to_double(out);
  const std::vector<int32_t> ix{4, 1, 0, 5};
  for (size_t i = 0; i < ix.size(); ++i)
    for (int64_t c = 0; c < 3; ++c) ref[size_t(ix[i] * 3 + c)] = in.item_as_double(int64_t(i) * 3 + c);
  index_copy_rows(out, in, ints(ix));
  expect_close("index_copy_rows", out, ref, 0, 0);
  // Duplicates accumulate, in index order, independent of the thread count.
  const int64_t w = 5000;  // wide enough to run threaded
  Tensor src = randn({5, w}, 504), acc = randn({3, w}, 505);
  const std::vector<int32_t> dup{2, 0, 2, 2, 1};
  std::vector<double> aref = to_double(acc);
  for (size_t i = 0; i < dup.size(); ++i)
    for (int64_t c = 0; c < w; ++c) aref[size_t(dup[i] * w + c)] += src.item_as_double(int64_t(i) * w + c);
  Tensor acc1 = acc.clone();
  index_copy_rows(acc, src, ints(dup), true);
  expect_close("index_copy_rows accumulate", acc, aref, 1e-6);
  omp_set_num_threads(1);
  index_copy_rows(acc1, src, ints(dup), true);
  omp_set_num_threads(2);
  EXPECT_EQ(acc1.to_float_vector(), acc.to_float_vector());
}

TEST(Rows, IndexOpsRejectBadArguments) {
  Tensor in = randn({4, 3}, 506), out = Tensor::empty({2, 3}, DType::F32);
  EXPECT_THROW(index_select_rows(out, in, ints({0, 4})), InternalError);   // out of range
  EXPECT_THROW(index_select_rows(out, in, ints({0, -1})), InternalError);
  EXPECT_THROW(index_select_rows(out, in, ints({0})), InternalError);      // count
  EXPECT_THROW(index_select_rows(Tensor::empty({2, 2}, DType::F32), in, ints({0, 1})), InternalError);
  EXPECT_THROW(index_select_rows(Tensor::empty({2, 3}, DType::I32), in, ints({0, 1})), InternalError);
  EXPECT_THROW(index_select_rows(in.narrow(0, 0, 2), in, ints({0, 1})), InternalError);  // overlap
  EXPECT_THROW(index_copy_rows(in, out, ints({1, 1})), InternalError);  // duplicate without accumulate
  EXPECT_THROW(index_copy_rows(in, out, ints({1, 7})), InternalError);
  EXPECT_THROW(index_copy_rows(Tensor::zeros({4, 3}, DType::I32), Tensor::zeros({2, 3}, DType::I32),
                               ints({0, 1}), true),
               InternalError);  // accumulate needs fp32
  try {
    index_select_rows(out, in, ints({0, 9}));
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("index[1] = 9"), std::string::npos) << e.what();
  }
}

TEST(Rows, FlatBufferRoundTrip) {
  std::vector<Tensor> parts{randn({3, 4}, 507), randn({5}, 508), randn({1, 1}, 509)};
  Tensor flat = Tensor::empty({18}, DType::F32);
  copy_to_flat(flat, parts);
  std::vector<double> ref;
  for (const Tensor& p : parts)
    for (double v : to_double(p)) ref.push_back(v);
  expect_close("copy_to_flat", flat, ref, 0, 0);
  scale(flat, 2.0f);
  copy_from_flat(parts, flat);
  size_t at = 0;
  for (const Tensor& p : parts)
    for (double v : to_double(p)) EXPECT_EQ(v, 2.0 * ref[at++]);
  EXPECT_THROW(copy_to_flat(Tensor::empty({17}, DType::F32), parts), InternalError);
  EXPECT_THROW(copy_to_flat(Tensor::empty({18}, DType::BF16), parts), InternalError);
  EXPECT_THROW(copy_from_flat({randn({4, 6}, 1).narrow(1, 0, 3)}, Tensor::empty({12}, DType::F32)),
               InternalError);  // non-contiguous part
}

TEST(Reductions, SumAndDotInDoubleForEveryFloatDtype) {
  const int64_t n = 20001;  // several blocks
  Tensor x = randn({n}, 510), y = randn({n}, 511);
  double sref = 0, dref = 0;
  for (int64_t i = 0; i < n; ++i) {
    sref += x.item_as_double(i);
    dref += x.item_as_double(i) * y.item_as_double(i);
  }
  EXPECT_NEAR(sum(x), sref, 1e-9);
  EXPECT_NEAR(dot(x, y), dref, 1e-9);
  omp_set_num_threads(1);
  const double s1 = sum(x), d1 = dot(x, y);
  omp_set_num_threads(2);
  EXPECT_EQ(s1, sum(x));  // fixed blocks: the same bits on any thread count
  EXPECT_EQ(d1, dot(x, y));
  for (DType t : {DType::BF16, DType::F16, DType::F64}) {
    Tensor xc = Tensor::empty({n}, t);
    cast(xc, x);
    double want = 0, wdot = 0;
    for (int64_t i = 0; i < n; ++i) {
      want += xc.item_as_double(i);
      wdot += xc.item_as_double(i) * y.item_as_double(i);
    }
    EXPECT_NEAR(sum(xc), want, 1e-9) << dtype_name(t);
    EXPECT_NEAR(dot(xc, y), wdot, 1e-9) << dtype_name(t);  // mixed dtypes
  }
  EXPECT_EQ(sum(Tensor::empty({0}, DType::F32)), 0.0);
  EXPECT_THROW(dot(x, randn({3}, 1)), InternalError);
  EXPECT_THROW(sum(Tensor::zeros({3}, DType::I32)), InternalError);
  EXPECT_THROW(sum(randn({4, 6}, 1).narrow(1, 0, 3)), InternalError);
}

// A single output row or column runs as a matrix-vector product: every transpose, alpha/beta,
// strided operands, and an output holding NaN with beta = 0.
TEST(Gemm, SingleRowOrColumnMatchesReference) {
  const int64_t k = 300, n = 517;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int column = 0; column < 2; ++column) {
        SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                     (column ? " column" : " row"));
        // Row case: c [1, n] = op(a) [1, k] op(b) [k, n]. Column case: c [n, 1] = op(a) [n, k] op(b) [k, 1].
        const int64_t m = column ? n : 1, nn = column ? 1 : n;
        Tensor wa = ta ? randn({k, m + 3}, 520) : randn({m, k + 3}, 520);
        Tensor a = ta ? wa.narrow(1, 1, m) : wa.narrow(1, 1, k);
        Tensor wb = tb ? randn({nn, k + 2}, 521) : randn({k, nn + 2}, 521);
        Tensor b = tb ? wb.narrow(1, 2, k) : wb.narrow(1, 2, nn);
        for (float beta : {0.0f, 0.5f}) {
          Tensor c = beta == 0 ? Tensor::full({m, nn}, NAN, DType::F32) : randn({m, nn}, 522);
          std::vector<double> ref(size_t(m * nn));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < nn; ++j) {
              double s = 0;
              for (int64_t p = 0; p < k; ++p)
                s += (ta ? a.item_as_double(p * m + i) : a.item_as_double(i * k + p)) *
                     (tb ? b.item_as_double(j * k + p) : b.item_as_double(p * nn + j));
              ref[size_t(i * nn + j)] = 1.5 * s + (beta == 0 ? 0.0 : beta * c.item_as_double(i * nn + j));
            }
          gemm(a, ta, b, tb, c, 1.5f, beta);
          expect_close("gemv", c, ref, 1e-4, 1e-5);
        }
      }
  // A column block of a wider output row.
  Tensor x = randn({1, 64}, 523), w = randn({40, 64}, 524), wide = Tensor::zeros({1, 50}, DType::F32);
  gemm(x, false, w, true, wide.narrow(1, 5, 40));
  EXPECT_EQ(wide.item_as_double(4), 0.0);
  EXPECT_EQ(wide.item_as_double(45), 0.0);
  double s = 0;
  for (int64_t p = 0; p < 64; ++p) s += x.item_as_double(p) * w.item_as_double(7 * 64 + p);
  EXPECT_NEAR(wide.item_as_double(12), s, 1e-4);
}

TEST(Optimizer, SgdStepWithMomentumAndWeightDecay) {
  const int64_t n = 1000;
  Tensor p = randn({n}, 530), g = randn({n}, 531), buf = randn({n}, 532);
  std::vector<double> pr = to_double(p), br = to_double(buf);
  const double lr = 0.1, wd = 0.01, mom = 0.9;
  for (int step = 0; step < 2; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g.item_as_double(i) + wd * pr[size_t(i)];
      br[size_t(i)] = step == 0 ? gi : mom * br[size_t(i)] + gi;
      pr[size_t(i)] -= lr * br[size_t(i)];
    }
    sgd_step(p, g, buf, float(lr), float(wd), float(mom), step == 0);
    expect_close("sgd param", p, pr, 1e-6);
    expect_close("sgd momentum", buf, br, 1e-6);
  }
  Tensor p2 = randn({n}, 533), b2 = Tensor::full({n}, NAN, DType::F32);
  std::vector<double> p2r = to_double(p2);
  for (int64_t i = 0; i < n; ++i) p2r[size_t(i)] -= 0.5 * g.item_as_double(i);
  sgd_step(p2, g, b2, 0.5f, 0.0f, 0.0f, false);  // no momentum: the buffer is not read
  expect_close("sgd without momentum", p2, p2r, 1e-6);
  EXPECT_THROW(sgd_step(p, randn({n - 1}, 1), buf, 0.1f, 0, 0, true), InternalError);
}

// The vocab-parallel cross-entropy steps on two vocabulary shards, summed as the all-reduces
// would, against the full-vocabulary softmax cross entropy with label smoothing.
TEST(VocabParallelXent, ShardsMatchFullSoftmaxWithLabelSmoothing) {
  const int64_t n = 7, V = 22, vl = V / 2;
  const float ls = 0.1f;
  Tensor logits = randn({n, V}, 540, 3.0f), dloss = randn({n}, 541);
  const std::vector<int64_t> tv{0, 21, 10, 11, 5, 16, 3};
  Tensor targets = Tensor::from_vector(tv, {n});
  std::vector<double> loss_ref, grad_ref;
  const double a = double(ls) * double(V) / double(V - 1);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -1e300, se = 0, mean_logp = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits.item_as_double(i * V + j));
    for (int64_t j = 0; j < V; ++j) se += std::exp(logits.item_as_double(i * V + j) - mx);
    const double lz = mx + std::log(se);
    for (int64_t j = 0; j < V; ++j) mean_logp += (logits.item_as_double(i * V + j) - lz) / double(V);
    const double nll = lz - logits.item_as_double(i * V + tv[size_t(i)]);
    loss_ref.push_back((1 - a) * nll - a * mean_logp);
    for (int64_t j = 0; j < V; ++j)
      grad_ref.push_back((std::exp(logits.item_as_double(i * V + j) - lz) - a / double(V) -
                          (j == tv[size_t(i)] ? 1 - a : 0.0)) *
                         dloss.item_as_double(i));
  }
  std::vector<Tensor> shard(2), max(2), stats(2), local(2);
  for (int r = 0; r < 2; ++r) {
    shard[size_t(r)] = logits.narrow(1, r * vl, vl).contiguous();
    max[size_t(r)] = Tensor::empty({n}, DType::F32);
    vocab_parallel_xent_max(max[size_t(r)], shard[size_t(r)], targets, V);
  }
  Tensor gmax = Tensor::empty({n}, DType::F32);  // the MAX all-reduce
  for (int64_t i = 0; i < n; ++i)
    gmax.data<float>()[i] = std::max(max[0].data<float>()[i], max[1].data<float>()[i]);
  Tensor total = Tensor::zeros({3, n}, DType::F32);
  for (int r = 0; r < 2; ++r) {
    stats[size_t(r)] = Tensor::empty({3, n}, DType::F32);
    local[size_t(r)] = Tensor::empty({n}, DType::I64);
    vocab_parallel_xent_partials(stats[size_t(r)], local[size_t(r)], shard[size_t(r)], gmax,
                                 targets, r * vl);
    add(total, total, stats[size_t(r)]);  // the SUM all-reduce
  }
  std::vector<double> got_grad(size_t(n * V));
  for (int r = 0; r < 2; ++r) {
    Tensor loss = Tensor::empty({n}, DType::F32);
    vocab_parallel_xent_loss(loss, shard[size_t(r)], total, V, ls);
    expect_close("loss rank " + std::to_string(r), loss, loss_ref, 1e-5, 1e-5);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t lt = local[size_t(r)].data<int64_t>()[i], t = tv[size_t(i)] - r * vl;
      EXPECT_EQ(lt, t >= 0 && t < vl ? t : -1);
    }
    Tensor dlogits = Tensor::empty({n, vl}, DType::F32);
    vocab_parallel_xent_bwd(dlogits, shard[size_t(r)], local[size_t(r)], dloss, V, ls);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < vl; ++j) got_grad[size_t(i * V + r * vl + j)] = dlogits.item_as_double(i * vl + j);
  }
  for (size_t k = 0; k < got_grad.size(); ++k) EXPECT_NEAR(got_grad[k], grad_ref[k], 1e-6) << k;
  // A target outside the vocabulary is the user's error, named with its token.
  Tensor bad = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 22, 0, 0}, {n});
  try {
    vocab_parallel_xent_max(max[0], shard[0], bad, V);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target id 22 at token 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vocab_parallel_xent_max(max[0], shard[0], Tensor::zeros({n}, DType::F32), V),
               InternalError);
  EXPECT_THROW(vocab_parallel_xent_partials(stats[0], local[0], shard[0], gmax,
                                            Tensor::zeros({n - 1}, DType::I32), 0),
               InternalError);
}

}  // namespace
}  // namespace megatron::ops
