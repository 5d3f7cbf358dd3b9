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
//   OutputLayer           copy / SP gather  logits [N, V/T] -> vocab-parallel cross entropy
//
// Weights are this rank's shards (Parameter::partition_dim, see tensor_parallel.h); a
// ColumnParallelLinear's bias is sharded with its output, a RowParallelLinear's bias is replicated
// and added after the reduction (by the caller's bias-dropout-add when skip_bias_add).
#pragma once

#include <cstdint>
#include <string>

#include "comm/vocab_parallel_cross_entropy.h"
#include "model/module.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

// y = x W^T + b, W [out, in] (PyTorch convention) split across the TP group. Returns y without
// the bias when skip_bias_add (the caller fuses it, as Megatron's bias-dropout-add does). Without a
// bias (--disable-bias-linear) the module has no bias weight at all.
struct LinearOptions {
  bool bias = true;
  bool skip_bias_add = false;
  // Rows of the full weight form `parts` equal blocks, each split across the TP ranks (SwiGLU's
  // fc1 is [gate; up]: every rank holds its rows of both, Parameter::partition_parts).
  int parts = 1;
  bool grad = true;  // allocate gradients (training); false for inference
  // The weight's initial distribution (the bias is zeros): N(0, std), or the scaled one of
  // Megatron's output projections (linear_proj, linear_fc2).
  InitMethod init = InitMethod::normal;
};

// t as the other operand of a product with a weight of dtype `dt`: itself for fp32, else rounded
// to dt (the bf16 activations a bf16 GEMM multiplies, as in Megatron's bf16 training).
Tensor product_operand(const Tensor& t, DType dt);
// Whether a layer keeps the product operand of its input for the backward (the weight gradient;
// the attention's bf16 operands) rather than the input itself: on a GPU, where the second cast
// costs a pass over the activation; the CPU keeps the input (the planner's memory model).
bool keeps_operand(const Tensor& x);

class LinearBase : public Module {
 public:
  Tensor forward(const LayerContext& ctx, const Tensor& x);   // -> [N or N/T, out]
  Tensor backward(const LayerContext& ctx, const Tensor& dy); // -> dx; grads +=
  // The dtype an input may come in without a cast before the product: bf16 where the weight
  // multiplies in bf16 (a producer that feeds only this layer writes bf16 directly), else fp32.
  DType input_dtype() const;
  int64_t in_features, out_features;  // this rank's (local) sizes
  bool skip_bias_add;
  Weight weight, bias;  // bias undefined without one

 protected:
  // in/out are the full (single-rank) sizes; the sharded one must be divisible by the TP size.
  LinearBase(const std::string& prefix, int64_t in, int64_t out, bool row_parallel, DType dtype,
             const TensorParallel& tp, const LinearOptions& opt);
  bool row_parallel_;
  TensorParallel tp_;
  // [N, in] (shared with the caller's input). ColumnParallelLinear under sequence parallelism
  // keeps only the caller's sequence shard [N/T, in] and all-gathers it again in backward, as
  // Megatron does, so the gathered input is never held between forward and backward.
  SavedTensor x_{this, "x", "[N, in] input (the caller's; the sequence shard under SP)"};
};

// Weight split on dim 0 (output rows) across tensor-parallel ranks, bias with it; input
// replicated (identity forward / all-reduce of dx backward) or, under sequence parallelism, the
// sequence shard (all-gather forward / reduce-scatter of dx backward). Output stays sharded.
class ColumnParallelLinear : public LinearBase {
 public:
  ColumnParallelLinear(const std::string& prefix, int64_t in, int64_t out, DType dtype,
                       const TensorParallel& tp = TensorParallel::none(),
                       const LinearOptions& opt = {})
      : LinearBase(prefix, in, out, false, dtype, tp, opt) {}
};
// Weight split on dim 1 (input columns); input already split. Partial products are all-reduced
// (identity backward) or, under sequence parallelism, reduce-scattered to the sequence shard
// (all-gather backward). The bias is replicated and added after the reduction, here by the
// caller's bias-dropout-add; under sequence parallelism its gradient is a partial sum.
class RowParallelLinear : public LinearBase {
 public:
  // The bias is never added here (skip_bias_add): the caller's bias-dropout-add adds it.
  RowParallelLinear(const std::string& prefix, int64_t in, int64_t out, DType dtype,
                    const TensorParallel& tp = TensorParallel::none(), LinearOptions opt = {})
      : LinearBase(prefix, in, out, true, dtype, tp, with_skip(opt)) {}

 private:
  static LinearOptions with_skip(LinearOptions o) {
    o.skip_bias_add = true;
    return o;
  }
};

// y = x W^T + b with the whole weight [out, in] on every rank (torch.nn.Linear, Megatron's
// get_linear_layer): the heads outside the tensor-parallel blocks (BERT's lm_head.dense, pooler,
// binary head). Weight N(0, --init-method-std), bias zeros. With partial_grad the rows are this
// rank's sequence shard, so the gradients are partial sums over the tensor-parallel group
// (WeightSpec::sequence_parallel).
class Linear : public Module {
 public:
  Linear(const std::string& prefix, int64_t in, int64_t out, DType dtype, bool partial_grad,
         bool grad = true);
  Tensor forward(const LayerContext& ctx, const Tensor& x);    // [N, in] -> [N, out]
  Tensor backward(const LayerContext& ctx, const Tensor& dy);  // -> dx; grads +=
  Weight weight, bias;

 private:
  SavedTensor x_{this, "x", "[N, in] input (the caller's)"};
};

// Word embeddings, plus learned absolute position embeddings when the model has them, plus
// token-type (segment) embeddings when it has them (BERT), then hidden dropout (Megatron's
// LanguageModelEmbedding). The word table is vocab-parallel: TP rank r holds rows
// [r*V/T, (r+1)*V/T) of the padded vocabulary; ids of other ranks give zero rows and the partial
// sums are all-reduced, or reduce-scattered to the sequence shard under sequence parallelism,
// where the position and token-type embeddings are then added to the local rows only (their
// gradients are partial sums, marked sequence_parallel). The word table is also a tied output
// layer's weight.
class Embedding : public Module {
 public:
  // max_positions 0: no position table (rotary, ALiBi or no position embedding); num_tokentypes
  // 0: no token-type table.
  Embedding(int64_t vocab, int64_t max_positions, int64_t h, float dropout, DType dtype,
            const TensorParallel& tp = TensorParallel::none(), bool grad = true,
            int64_t num_tokentypes = 0);
  // -> [N, h], or [N/T, h] (this rank's sequence shard) under sequence parallelism. position_ids
  // is read only with a position table, tokentype_ids only with a token-type table (required
  // then).
  Tensor forward(const LayerContext& ctx, const Tensor& tokens, const Tensor& position_ids,
                 const Tensor& tokentype_ids = Tensor());
  void backward(const LayerContext& ctx, const Tensor& dout);  // grads +=
  int64_t vocab_size, vocab_start;  // padded global vocabulary; first row held here
  Weight word, position, tokentype;  // position / tokentype undefined without a table
  float dropout;

 private:
  TensorParallel tp_;
  SavedTensor tokens_{this, "tokens", "[b, s] int32 (the caller's)"};
  SavedTensor position_ids_{this, "position_ids", "[b, s] int32 (the caller's)"};
  SavedTensor tokentype_ids_{this, "tokentype_ids", "[b, s] int32 (the caller's)"};
};

// The output layer (column-parallel over the vocabulary, weight [V/T, h], optionally a bias [V/T])
// and the loss: logits stay vocab-sharded and go through vocab-parallel cross entropy, in row
// chunks so at most [chunk, V/T] logits exist at a time. Its weight is the word embedding's
// (tied) or its own "output_layer.weight": untied (--untie-embeddings-and-output-weights), or,
// tied on the last pipeline stage, a copy of the first stage's table (WeightSpec::shared). BERT's
// output layer has a bias ("output_layer.bias", sharded with the vocabulary).
class OutputLayer : public Module {
 public:
  // Tied to `word` (an Embedding's table in the same model chunk).
  OutputLayer(Weight& word, int64_t vocab_size, const TensorParallel& tp, bool bias = false,
              DType dtype = DType::F32, bool grad = true);
  // Its own weight [V/T, h]: `shared` marks the last stage's copy of a tied table.
  OutputLayer(int64_t vocab_size, int64_t h, DType dtype, const TensorParallel& tp, bool shared,
              bool grad = true, bool bias = false);
  // Per-token losses [N] of final hidden states x ([N, h], or the [N/T, h] shard under sequence
  // parallelism) against labels [N] int32 (loss_mask [N] fp32). When dx is non-null it receives
  // d(grad_scale * sum(loss * mask))/dx (x's shape) and the weight's (and bias') grad is
  // accumulated (+=).
  Tensor loss(const Tensor& x, const Tensor& labels, const Tensor& loss_mask, float grad_scale,
              Tensor* dx);
  // Full logits [N, V] (gathered over the vocabulary shards: generation and tests, not training).
  Tensor logits(const Tensor& x);
  Weight& weight() { return *weight_; }
  bool owns_weight() const { return own_.defined(); }
  Weight bias;  // undefined without one

 private:
  void init_bias(DType dtype, bool grad);
  Tensor input_region(const Tensor& x) const;  // all-gather of the sequence shard under SP
  Weight own_;
  Weight* weight_;
  int64_t vocab_size_;
  TensorParallel tp_;
  Tensor logits_buf_;
  VocabParallelCrossEntropy::Saved xent_;
};

}  // namespace megatron::model
