// Vocab-parallel cross entropy (spec 8.2): per-token softmax cross entropy over logits sharded
// along the vocabulary across the tensor-parallel group, without ever gathering full logits.
// Rank r of a group of size P holds vocabulary ids [r*Vl, (r+1)*Vl) with Vl = logits.size(-1).
//
// Forward (fp32): max -> all-reduce MAX; target logit and sum of exp (and, with label smoothing,
// the sum of log-softmax) -> one all-reduce SUM; loss = log Z - z_t. Backward is local:
// grad = (softmax - (1 - a') onehot_t - a'/V) * dloss, the onehot only on the owning rank.
//
// Label smoothing uses the global vocabulary: a' = a*V/(V-1) and the mean log-probability over
// all V entries, so the loss does not depend on the TP size. At TP=1 this equals Megatron;
// Megatron at TP>1 uses the local shard width instead (its issue #7452), which is not reproduced.
#pragma once

#include "comm/communicator.h"

namespace megatron {

struct VocabParallelCrossEntropy {
  struct Saved {
    Tensor softmax;         // [N, Vl] fp32, this rank's shard of the softmax
    Tensor local_target;    // [N] int64: target - vocab_start, or -1 if another rank owns it
    Shape logits_shape;     // [..., Vl]
    int64_t vocab_size = 0; // global V
    float label_smoothing = 0.0f;
  };

  // logits: [..., Vl] fp32/bf16/fp16 (any layout); targets: [...] int32/int64 global ids in
  // [0, Vl * group size). Returns the per-token loss [...] in fp32 and fills `saved`.
  static Tensor forward(Communicator& tp, const Tensor& logits, const Tensor& targets, Saved& saved,
                        float label_smoothing = 0.0f);
  // grad_loss: [...] (the loss's shape, any float dtype). Returns dlogits [..., Vl] in fp32.
  static Tensor backward(const Saved& saved, const Tensor& grad_loss);
};

}  // namespace megatron
