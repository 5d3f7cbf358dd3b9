// Tensor-parallel layers (Megatron's tensor_parallel/layers.py), built only from the conjugate
// mappings of comm/tp_mappings.h over the layer's TensorParallel group. With a group of one they
// are the plain layers and communicate nothing.
//
// Activations are batch-first [rows, width] with rows = b*s. Under sequence parallelism the
// regions outside the tensor-parallel blocks (LayerNorm, dropout, residual) hold rows
// [r*N/T, (r+1)*N/T) of the N = b*s rows on TP rank r (a contiguous row block: Megatron splits
// dim 0 of its sequence-first [s, b, h], we split dim 0 of our batch-first [b*s, h]; every op in
// those regions is per token, so only the share matters; Megatron's s % T == 0 rule is kept).
//
//   layer                 forward input     forward output        backward (input grad)
//   ColumnParallelLinear  copy / SP gather  [N, out/T] (sharded)  all-reduce / SP reduce-scatter
//   RowParallelLinear     [N, in/T]         all-reduce / SP r-s   identity / SP all-gather
//   Embedding (vocab-p.)  ids [b, s]        all-reduce / SP r-s   identity / SP all-gather
//   VocabParallelOutput   copy / SP gather  logits [N, V/T] -> vocab-parallel cross entropy
//
// Weights are this rank's shards (Parameter::partition_dim, see tensor_parallel.h); a
// ColumnParallelLinear's bias is sharded with its output, a RowParallelLinear's bias is replicated
// and added after the reduction (by the caller's bias-dropout-add when skip_bias_add).
#pragma once

#include <cstdint>
#include <string>

#include "comm/vocab_parallel_cross_entropy.h"
#include "model/layer_base.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

// y = x W^T + b, W [out, in] (PyTorch convention) split across the TP group. Returns y without
// the bias when skip_bias_add (the caller fuses it, as Megatron's bias-dropout-add does).
class LinearBase {
 public:
  struct Saved {
    // [N, in] (shared with the caller's input). ColumnParallelLinear under sequence parallelism
    // keeps only the caller's sequence shard [N/T, in] and all-gathers it again in backward, as
    // Megatron does, so the gathered input is never held between forward and backward.
    Tensor x;
    size_t bytes() const { return 0; }
  };
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> [N or N/T, out]
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx; grads +=
  void parameters(ParameterList& out);
  void refresh_working_weights();
  int64_t in_features, out_features;  // this rank's (local) sizes
  bool skip_bias_add;
  Saved saved;
  Weight weight, bias;

 protected:
  // in/out are the full (single-rank) sizes; the sharded one must be divisible by the TP size.
  LinearBase(const std::string& prefix, int64_t in, int64_t out, bool row_parallel,
             bool skip_bias_add, DType dtype, const TensorParallel& tp);
  bool row_parallel_;
  TensorParallel tp_;
};

// Weight split on dim 0 (output rows) across tensor-parallel ranks, bias with it; input
// replicated (identity forward / all-reduce of dx backward) or, under sequence parallelism, the
// sequence shard (all-gather forward / reduce-scatter of dx backward). Output stays sharded.
class ColumnParallelLinear : public LinearBase {
 public:
  ColumnParallelLinear(const std::string& prefix, int64_t in, int64_t out, DType dtype,
                       const TensorParallel& tp = TensorParallel::none())
      : LinearBase(prefix, in, out, false, false, dtype, tp) {}
};
// Weight split on dim 1 (input columns); input already split. Partial products are all-reduced
// (identity backward) or, under sequence parallelism, reduce-scattered to the sequence shard
// (all-gather backward). The bias is replicated and added after the reduction, here by the
// caller's bias-dropout-add; under sequence parallelism its gradient is a partial sum.
class RowParallelLinear : public LinearBase {
 public:
  RowParallelLinear(const std::string& prefix, int64_t in, int64_t out, DType dtype,
                    const TensorParallel& tp = TensorParallel::none())
      : LinearBase(prefix, in, out, true, true, dtype, tp) {}
};

// Word + learned absolute position embeddings, then hidden dropout (Megatron's
// LanguageModelEmbedding). The word table is vocab-parallel: TP rank r holds rows
// [r*V/T, (r+1)*V/T) of the padded vocabulary; ids of other ranks give zero rows and the partial
// sums are all-reduced, or reduce-scattered to the sequence shard under sequence parallelism, where
// the position embedding is then added to the local rows only (its gradient is a partial sum,
// marked sequence_parallel). The word table is also the tied output layer's weight.
class Embedding {
 public:
  Embedding(int64_t vocab, int64_t max_positions, int64_t h, float dropout, DType dtype,
            const TensorParallel& tp = TensorParallel::none());
  struct Saved {
    Tensor tokens;        // [b, s] int32 (caller's)
    Tensor position_ids;  // [b, s] int32 (caller's)
    size_t bytes() const { return 0; }
  };
  // -> [N, h], or [N/T, h] (this rank's sequence shard) under sequence parallelism.
  Tensor forward(const LayerContext& ctx, const Tensor& tokens, const Tensor& position_ids);
  void backward(const LayerContext& ctx, const Tensor& dout);  // grads +=
  void parameters(ParameterList& out);
  void refresh_working_weights();
  int64_t vocab_size, vocab_start;  // padded global vocabulary; first row held here
  Saved saved;
  Weight word, position;
  float dropout;

 private:
  TensorParallel tp_;
};

// The output layer tied to the word embedding (column-parallel over the vocabulary, weight = the
// embedding's shard [V/T, h]) and the loss: logits stay vocab-sharded and go through
// vocab-parallel cross entropy, in row chunks so at most [chunk, V/T] logits exist at a time.
class VocabParallelOutput {
 public:
  VocabParallelOutput(Weight& word, int64_t vocab_size, const TensorParallel& tp);
  // Per-token losses [N] of final hidden states x ([N, h], or the [N/T, h] shard under sequence
  // parallelism) against labels [N] int32 (loss_mask [N] fp32). When dx is non-null it receives
  // d(grad_scale * sum(loss * mask))/dx (x's shape) and the word grad is accumulated (+=).
  Tensor loss(const Tensor& x, const Tensor& labels, const Tensor& loss_mask, float grad_scale,
              Tensor* dx);
  // Full logits [N, V] (gathered over the vocabulary shards: generation and tests, not training).
  Tensor logits(const Tensor& x);

 private:
  Tensor input_region(const Tensor& x) const;  // all-gather of the sequence shard under SP
  Weight& word_;
  int64_t vocab_size_;
  TensorParallel tp_;
  Tensor logits_buf_;
  VocabParallelCrossEntropy::Saved xent_;
};

}  // namespace megatron::model
