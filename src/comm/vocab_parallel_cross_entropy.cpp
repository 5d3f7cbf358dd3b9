// Vocab-parallel cross entropy: forward with two all-reduces (MAX, then one fused SUM of the
// target logit, the sum of exponentials and the sum of log-softmax), local backward. The per-row
// work is ops::vocab_parallel_xent_*; this file holds the collectives between the steps.
#include "comm/vocab_parallel_cross_entropy.h"

#include "kernels/ops.h"

namespace megatron {

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
  const Tensor tgt = targets.contiguous().view({n});

  saved.logits_shape = logits.shape();
  saved.vocab_size = vocab;
  saved.label_smoothing = label_smoothing;
  const Device dev = logits.device();
  saved.softmax = logits.to(DType::F32).contiguous().view({n, vl});  // a copy (to() always copies)
  saved.local_target = Tensor::empty({n}, DType::I64, dev);

  // 1. Global max per token (targets checked first, alike on every rank).
  Tensor mx = Tensor::empty({n}, DType::F32, dev);
  ops::vocab_parallel_xent_max(mx, saved.softmax, tgt, vocab);
  tp.all_reduce(mx, ReduceOp::Max);

  // 2. Shift, target logit, sum of exp, sum of shifted logits (for the smoothing term).
  Tensor sums = Tensor::empty({3, n}, DType::F32, dev);
  ops::vocab_parallel_xent_partials(sums, saved.local_target, saved.softmax, mx, tgt, start);
  tp.all_reduce(sums, ReduceOp::Sum);

  // 3. loss = log Z - z_t; softmax = exp / Z; smoothing with the global mean log-probability.
  Tensor loss = Tensor::empty(loss_shape, DType::F32, dev);
  ops::vocab_parallel_xent_loss(loss, saved.softmax, sums, vocab, label_smoothing);
  return loss;
}

Tensor VocabParallelCrossEntropy::backward(const Saved& saved, const Tensor& grad_loss) {
  MG_CHECK(saved.softmax.defined(), "vocab-parallel cross entropy backward before forward");
  const int64_t n = saved.softmax.size(0), vl = saved.softmax.size(1);
  MG_CHECK(grad_loss.numel() == n, "cross entropy backward: ", grad_loss.numel(),
           " upstream gradients for ", n, " tokens");
  const Tensor g = grad_loss.to(DType::F32).contiguous().view({n});
  Tensor grad = Tensor::empty(saved.logits_shape, DType::F32, saved.softmax.device());
  ops::vocab_parallel_xent_bwd(grad.view({n, vl}), saved.softmax, saved.local_target, g,
                               saved.vocab_size, saved.label_smoothing);
  return grad;
}

}  // namespace megatron
