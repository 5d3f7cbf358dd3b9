// Vocab-parallel cross entropy against a float64 single-rank softmax cross entropy computed here:
// every rank builds the same full logits, keeps its vocabulary shard, and checks its losses and
// its shard of the gradient. Runs at world 1 and under mpirun -np 2 / 4 (Mpi* tests).
#include <gtest/gtest.h>

#include <cmath>

#include "comm/tp_mappings.h"
#include "comm/vocab_parallel_cross_entropy.h"

namespace megatron {
namespace {

constexpr int64_t kTokens = 7, kVocab = 24;  // 24 divides by 1, 2, 3, 4

Tensor full_logits(DType dt) {
  Tensor t = Tensor::empty({kTokens, kVocab}, DType::F32);
  for (int64_t i = 0; i < kTokens; ++i)
    for (int64_t j = 0; j < kVocab; ++j)
      t.data<float>()[i * kVocab + j] = float(4.0 * std::sin(0.37 * double(i * 31 + j * 7)) + 0.05 * j);
  return t.to(dt);
}

std::vector<int64_t> target_ids() {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < kTokens; ++i) t.push_back((i * 11 + 3) % kVocab);
  t[0] = kVocab - 1;  // last entry of the last shard
  return t;
}

// Reference: float64 softmax cross entropy over the full vocabulary (with smoothing a).
void reference(const Tensor& logits, const std::vector<int64_t>& tgt, double a,
               std::vector<double>& loss, std::vector<double>& grad) {
  loss.assign(kTokens, 0);
  grad.assign(kTokens * kVocab, 0);
  const double as = a * kVocab / (kVocab - 1);
  for (int64_t i = 0; i < kTokens; ++i) {
    double m = -1e300;
    for (int64_t j = 0; j < kVocab; ++j) m = std::max(m, logits.item_as_double(i * kVocab + j));
    double z = 0;
    for (int64_t j = 0; j < kVocab; ++j) z += std::exp(logits.item_as_double(i * kVocab + j) - m);
    double mean_logp = 0;
    for (int64_t j = 0; j < kVocab; ++j) {
      const double logp = logits.item_as_double(i * kVocab + j) - m - std::log(z);
      mean_logp += logp / kVocab;
      const double p = std::exp(logp);
      grad[size_t(i * kVocab + j)] = p - (j == tgt[size_t(i)] ? 1.0 - as : 0.0) - as / kVocab;
    }
    const double nll = -(logits.item_as_double(i * kVocab + tgt[size_t(i)]) - m - std::log(z));
    loss[size_t(i)] = (1 - as) * nll - as * mean_logp;
  }
}

void check(DType dt, float smoothing, Shape shape) {
  auto w = world_communicator();
  const int r = w->rank();
  const int64_t vl = kVocab / w->size();
  const Tensor full = full_logits(dt);
  const auto tgt = target_ids();
  std::vector<double> ref_loss, ref_grad;
  reference(full, tgt, double(smoothing), ref_loss, ref_grad);

  Shape lshape = shape;
  lshape.push_back(vl);
  Tensor local = full.narrow(1, r * vl, vl).contiguous().view(lshape);
  Tensor targets = Tensor::from_vector<int64_t>(tgt, shape);
  VocabParallelCrossEntropy::Saved saved;
  Tensor loss = VocabParallelCrossEntropy::forward(*w, local, targets, saved, smoothing);
  ASSERT_EQ(loss.shape(), shape);
  for (int64_t i = 0; i < kTokens; ++i)
    EXPECT_NEAR(loss.item_as_double(i), ref_loss[size_t(i)], 2e-5 * (1 + std::abs(ref_loss[size_t(i)])))
        << "token " << i << " rank " << r;
  // Upstream gradient: token i weighs (i + 1) / 4.
  Tensor dl = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < kTokens; ++i) dl.data<float>()[i] = float(i + 1) / 4;
  Tensor g = VocabParallelCrossEntropy::backward(saved, dl);
  ASSERT_EQ(g.shape(), lshape);
  for (int64_t i = 0; i < kTokens; ++i)
    for (int64_t j = 0; j < vl; ++j)
      EXPECT_NEAR(g.item_as_double(i * vl + j), ref_grad[size_t(i * kVocab + r * vl + j)] * (i + 1) / 4, 1e-6)
          << "token " << i << " local column " << j << " rank " << r;
}

TEST(MpiVocabParallelCrossEntropy, MatchesSingleRankFp32) { check(DType::F32, 0.0f, {kTokens}); }
TEST(MpiVocabParallelCrossEntropy, MatchesSingleRankBf16Logits3D) {
  check(DType::BF16, 0.0f, {1, kTokens});
}
TEST(MpiVocabParallelCrossEntropy, LabelSmoothingUsesGlobalVocabulary) {
  check(DType::F32, 0.1f, {kTokens});
}

TEST(MpiVocabParallelCrossEntropy, RejectsTargetsOutsideVocabulary) {
  auto w = world_communicator();
  const int64_t vl = kVocab / w->size();
  Tensor local = Tensor::zeros({2, vl}, DType::F32);
  VocabParallelCrossEntropy::Saved saved;
  EXPECT_THROW(VocabParallelCrossEntropy::forward(
                   *w, local, Tensor::from_vector<int32_t>({0, int32_t(kVocab)}, {2}), saved),
               Error);
  EXPECT_THROW(VocabParallelCrossEntropy::forward(
                   *w, local, Tensor::from_vector<int64_t>({-1, 0}, {2}), saved),
               Error);
}

}  // namespace
}  // namespace megatron
