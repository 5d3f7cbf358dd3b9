// Vocab-parallel cross entropy: forward with two all-reduces (MAX, then one fused SUM of the
// target logit, the sum of exponentials and the sum of log-softmax), local backward.
#include "comm/vocab_parallel_cross_entropy.h"

#include <cmath>
#include <limits>

namespace megatron {

namespace {

std::vector<int64_t> read_targets(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<int64_t> out(size_t(c.numel()));
  if (c.dtype() == DType::I64) {
    std::copy(c.data<int64_t>(), c.data<int64_t>() + c.numel(), out.begin());
  } else {
    MG_CHECK(c.dtype() == DType::I32, "cross entropy targets must be int32 or int64, got ",
             dtype_name(c.dtype()));
    std::copy(c.data<int32_t>(), c.data<int32_t>() + c.numel(), out.begin());
  }
  return out;
}

}  // namespace

Tensor VocabParallelCrossEntropy::forward(Communicator& tp, const Tensor& logits,
                                          const Tensor& targets, Saved& saved,
                                          float label_smoothing) {
  MG_CHECK(logits.dim() >= 1 && dtype_is_floating(logits.dtype()),
           "vocab-parallel cross entropy: logits must be a float tensor [..., vocab shard]");
  const int64_t vl = logits.size(-1);
  const int64_t n = vl == 0 ? 0 : logits.numel() / vl;
  Shape loss_shape(logits.shape().begin(), logits.shape().end() - 1);
  MG_CHECK(targets.numel() == n, "vocab-parallel cross entropy: ", targets.numel(),
           " targets for logits ", shape_str(logits.shape()));
  MG_REQUIRE(label_smoothing >= 0.0f && label_smoothing < 1.0f,
             "--label-smoothing must be in [0, 1), got ", label_smoothing);
  const int64_t vocab = vl * tp.size();
  MG_REQUIRE(label_smoothing == 0.0f || vocab > 1, "--label-smoothing needs a vocabulary of more "
             "than one entry");
  const int64_t start = vl * tp.rank();
  const auto tgt = read_targets(targets);

  saved.logits_shape = logits.shape();
  saved.vocab_size = vocab;
  saved.label_smoothing = label_smoothing;
  saved.softmax = logits.to(DType::F32).contiguous().view({n, vl});
  if (saved.softmax.raw_data() == logits.raw_data()) saved.softmax = saved.softmax.clone();
  saved.local_target = Tensor::empty({n}, DType::I64);
  float* z = saved.softmax.data<float>();
  int64_t* lt = saved.local_target.data<int64_t>();

  // 1. Global max per token.
  Tensor mx = Tensor::empty({n}, DType::F32);
  float* m = mx.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    MG_REQUIRE(tgt[size_t(i)] >= 0 && tgt[size_t(i)] < vocab, "cross entropy: target id ",
               tgt[size_t(i)], " at token ", i, " is outside the vocabulary [0, ", vocab,
               "); check the tokenizer / --vocab-size of the data");
    float v = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vl; ++j) v = std::max(v, z[i * vl + j]);
    m[i] = v;
  }
  tp.all_reduce(mx, ReduceOp::Max);

  // 2. Shift, target logit, sum of exp, sum of shifted logits (for the smoothing term).
  Tensor sums = Tensor::zeros({3, n}, DType::F32);
  float* pred = sums.data<float>();
  float* sexp = pred + n;
  float* szs = pred + 2 * n;
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float* row = z + i * vl;
    const int64_t t = tgt[size_t(i)] - start;
    lt[i] = (t >= 0 && t < vl) ? t : -1;
    if (lt[i] >= 0) pred[i] = row[lt[i]] - m[i];  // other ranks contribute 0
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
  tp.all_reduce(sums, ReduceOp::Sum);

  // 3. loss = log Z - z_t; softmax = exp / Z; smoothing with the global mean log-probability.
  Tensor loss = Tensor::empty(loss_shape, DType::F32);
  float* l = loss.data<float>();
  const double a = label_smoothing > 0 ? double(label_smoothing) * double(vocab) / double(vocab - 1) : 0.0;
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float log_z = std::log(sexp[i]);
    float loss_i = log_z - pred[i];
    if (a > 0) {
      const double mean_log_p = double(szs[i]) / double(vocab) - double(log_z);
      loss_i = float((1.0 - a) * double(loss_i) - a * mean_log_p);
    }
    l[i] = loss_i;
    const float inv = 1.0f / sexp[i];
    for (int64_t j = 0; j < vl; ++j) z[i * vl + j] *= inv;
  }
  return loss;
}

Tensor VocabParallelCrossEntropy::backward(const Saved& saved, const Tensor& grad_loss) {
  MG_CHECK(saved.softmax.defined(), "vocab-parallel cross entropy backward before forward");
  const int64_t n = saved.softmax.size(0), vl = saved.softmax.size(1);
  MG_CHECK(grad_loss.numel() == n, "cross entropy backward: ", grad_loss.numel(),
           " upstream gradients for ", n, " tokens");
  const Tensor g = grad_loss.to(DType::F32).contiguous();
  const float* gl = g.data<float>();
  const float* sm = saved.softmax.data<float>();
  const int64_t* lt = saved.local_target.data<int64_t>();
  const double a = saved.label_smoothing > 0
                       ? double(saved.label_smoothing) * double(saved.vocab_size) /
                             double(saved.vocab_size - 1)
                       : 0.0;
  const float hit = float(1.0 - a), floor = float(a / double(saved.vocab_size));
  Tensor grad = Tensor::empty(saved.logits_shape, DType::F32);
  float* d = grad.data<float>();
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < vl; ++j) d[i * vl + j] = (sm[i * vl + j] - floor) * gl[i];
    if (lt[i] >= 0) d[i * vl + lt[i]] -= hit * gl[i];
  }
  return grad;
}

}  // namespace megatron
