// GPT model (Megatron-Core "local" layer spec) with explicit forward and backward on the CPU.
// Activations are batch-first: a micro-batch of b sequences of s tokens is a [b*s, h] row-major
// matrix (token (bi, si) is row bi*s + si). Every layer owns its Parameters (value in
// params_dtype, fp32 grad accumulated +=); compute is fp32 (bf16/fp16 weights are converted once
// per call into an fp32 working copy). Parameter names and shapes follow Megatron-Core
// (embedding.word_embeddings.weight, decoder.layers.{i}.self_attention.linear_qkv.weight, ...),
// the output layer is tied to the word embedding and logits span the padded vocabulary.
// Dropout masks are pure functions of (seed, dropout_offset, layer, site, element), so
// recomputation and resume reproduce them exactly.
//
// Tensor parallelism (Megatron 1-D TP, optional sequence parallelism): construct the model with
// the tensor-parallel group (or the ParallelState). Every rank of the group calls the same
// methods with the same inputs (the whole micro-batch); parameters() are this rank's shards under
// the single-rank names (layout: tensor_parallel.h), losses and returned logits are the same on
// every rank and equal the single-rank model's. Initialisation draws each whole master weight
// exactly as the single-rank model does and keeps this rank's slice, so the sharded model equals
// the unsharded one for the same seed (TP-size invariant, like --use-cpu-initialization).
// Context parallelism (context_parallel.h): construct with a CP group too (the ParallelState
// constructor does). Every rank of a CP group is given its own slice of the micro-batch
// (slice_for_context_parallel: S/C tokens, chunks r and 2C-1-r); losses and gradients are this
// rank's partial sums, which the caller sums over the (data x) context parallel group; logits are
// those of the local tokens.
// After the last micro-batch's backward of a step the trainer must call
// all_reduce_sequence_parallel_grads() (a no-op without sequence parallelism); see
// tensor_parallel.h for the grad-norm rule.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/parallel_state.h"
#include "core/tensor.h"
#include "model/parameter.h"

namespace megatron::model {

struct GPTConfig {
  int num_layers = 0, hidden_size = 0, num_attention_heads = 0;
  int ffn_hidden_size = 0;  // 0 -> 4h
  int kv_channels = 0;      // 0 -> h / n
  int num_query_groups = 0; // 0 -> num_attention_heads (no GQA); --num-query-groups
  int seq_length = 0, max_position_embeddings = 0;
  int64_t padded_vocab_size = 0;
  float hidden_dropout = 0.1f, attention_dropout = 0.1f;
  float init_method_std = 0.02f, layernorm_epsilon = 1e-5f;
  // Megatron's default (bias_activation_fusion on) computes GELU through bias_gelu_impl, the tanh
  // approximation; --no-bias-gelu-fusion falls back to exact erf F.gelu (gelu_tanh = false).
  bool gelu_tanh = true;
  DType params_dtype = DType::F32;
  std::string recompute_granularity;  // "", "full", "selective"
  std::string recompute_method;       // "uniform", "block" (full only)
  int recompute_num_layers = 0;
  bool apply_query_key_layer_scaling = false;  // mathematically a no-op in fp32 softmax
  // --sequence-parallel: LayerNorm/dropout/residual regions hold seq/T of the tokens. Ignored
  // (as Megatron does) when the tensor-parallel size is 1.
  bool sequence_parallel = false;
  // --cp-comm-type: how context-parallel attention exchanges keys and values ("p2p", the ring,
  // or "allgather"; context_parallel.h). Same results, different communication.
  std::string cp_comm_type = "p2p";

  int ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // Throws megatron::Error naming the inconsistent field.
  void validate() const;
  // The checks that depend on the tensor-parallel size T (--tensor-model-parallel-size): hidden
  // size, heads, query groups, FFN size and padded vocabulary divisible by T; under sequence
  // parallelism the sequence length too. Throws megatron::Error naming the flags.
  void validate_tensor_parallel(int tp_size) const;
};

struct GPTInputs {
  Tensor tokens;           // [b, s] int32
  Tensor position_ids;     // [b, s] int32
  Tensor attention_start;  // [b, s] int32 (query i attends keys start[i]..i) or undefined = causal
  Tensor labels;           // [b, s] int32
  Tensor loss_mask;        // [b, s] float32
};

// CP rank `rank` of `size`'s part of a micro-batch: every [b, S] tensor becomes [b, S/size], the
// columns of chunks rank and 2*size-1-rank of the 2*size chunks (context_parallel.h); position
// ids and attention starts keep their values (positions in the whole sequence). Error unless S is
// divisible by 2*size. size 1: `in` itself.
GPTInputs slice_for_context_parallel(const GPTInputs& in, int rank, int size);

// Megatron's forward pre-hook: called during every forward pass (training, evaluation, logits)
// with a module's parameters just before the module first reads them, in forward order: the
// embedding (word table, which the tied output layer reads too, and position table), each
// transformer layer, the final LayerNorm (the pipeline's last stage: and output_layer.weight).
// The module's working weights are refreshed from the parameters right after the call, so the
// hook may still be bringing the parameter values in. --overlap-param-gather uses it to wait for
// the all-gather of the buckets holding them (optim::ParamAndGradBuffer::wait_params) while the
// gathers of later layers go on. The hook must not throw part-way on one rank only.
using ForwardPreHook = std::function<void(const ParameterList& params)>;

// Calls `hook` (a forward pre-hook or a grad-ready hook; nothing when it is empty) with the
// parameters of `module` (anything with parameters(ParameterList&)).
template <class Module>
void call_with_parameters(const std::function<void(const ParameterList&)>& hook, Module& module) {
  if (!hook) return;
  ParameterList ps;
  module.parameters(ps);
  hook(ps);
}

struct LossResult {
  double loss_sum = 0;    // sum over tokens of loss * mask
  double num_tokens = 0;  // sum of mask
};

class GPTModel {
 public:
  // Megatron init: weights N(0, std); output projections (linear_proj, linear_fc2) N(0,
  // std/sqrt(2L)); biases 0; LayerNorm weight 1, bias 0. Deterministic in `seed`.
  GPTModel(const GPTConfig& cfg, uint64_t seed);
  // Tensor-parallel model over `tp_group` (each rank holds 1/T of the sharded weights). A group of
  // one is the single-rank model. Collective: all ranks of the group construct it together.
  GPTModel(const GPTConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group);
  // Tensor- and context-parallel model (cp_group: the ranks sharing each sequence; a group of one
  // for no context parallelism). Collective over both groups.
  GPTModel(const GPTConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group,
           std::shared_ptr<Communicator> cp_group);
  // The same over the ParallelState's tensor- and context-parallel groups.
  GPTModel(const GPTConfig& cfg, uint64_t seed, const ParallelState& parallel)
      : GPTModel(cfg, seed, parallel.group_ptr(GroupKind::TP), parallel.group_ptr(GroupKind::CP)) {}
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // This rank's parameters (shards under TP; Parameter::partition_dim / sequence_parallel say
  // how), in a stable order, the same for every TP size: embedding.word_embeddings,
  // embedding.position_embeddings, then per layer input_layernorm.{weight,bias},
  // self_attention.linear_qkv.{weight,bias}, self_attention.linear_proj.{weight,bias},
  // pre_mlp_layernorm.{weight,bias}, mlp.linear_fc1.{weight,bias}, mlp.linear_fc2.{weight,bias};
  // decoder.final_layernorm.
  ParameterList parameters();

  // Training micro-batch: forward + backward. Gradients of grad_scale * sum(loss * mask) are
  // ADDED into Parameter::grad. Dropout masks are a pure function of (seed, dropout_offset);
  // dropout_offset must be < 2^40 (e.g. iteration * num_microbatches + microbatch).
  LossResult forward_backward(const GPTInputs& in, float grad_scale, uint64_t dropout_offset);
  // Evaluation: no dropout, nothing saved for backward. labels/loss_mask required.
  LossResult forward_loss(const GPTInputs& in);
  // [b, s, padded_vocab] fp32 logits, no dropout (generation, tests). attention_start as in
  // GPTInputs (undefined = plain causal). Under TP the vocabulary shards are gathered (the
  // training and eval losses never gather logits).
  Tensor forward_logits(const Tensor& tokens, const Tensor& position_ids,
                        const Tensor& attention_start = Tensor());

  // Sums the gradients of the sequence-parallel parameters (LayerNorm weights/biases,
  // row-parallel biases, position embedding) over the TP group: call once per step after the
  // last micro-batch's backward, before the data-parallel reduction and the grad norm. No-op
  // without sequence parallelism. Collective over the TP group.
  void all_reduce_sequence_parallel_grads();

  // Called inside forward_backward as soon as a group of parameters has received its last
  // gradient contribution of the micro-batch: the final LayerNorm, then each transformer layer
  // from the last to the first, then the embedding (word table incl. the tied output layer's
  // part, position table). The trainer uses it to start the data-parallel reduction of a bucket
  // while backward goes on (--overlap-grad-reduce). An empty function (the default) disables it.
  using GradReadyHook = std::function<void(const ParameterList& ready)>;
  void set_grad_ready_hook(GradReadyHook hook);
  // The forward pre-hook (see ForwardPreHook above); an empty function (the default) disables it.
  void set_forward_pre_hook(ForwardPreHook hook);

  const GPTConfig& config() const;
  int tensor_parallel_size() const;
  int tensor_parallel_rank() const;
  int context_parallel_size() const;
  int context_parallel_rank() const;
  bool sequence_parallel() const;  // config().sequence_parallel && TP > 1
  // Peak bytes of activations held for backward during the last forward_backward (saved layer
  // activations, recompute chunk inputs; workspaces and the loss head's logits chunk excluded).
  size_t activation_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct TensorParallel;
// Megatron's initial value of a parameter (shared by GPTModel and the pipeline stages of
// gpt_stage.h): the whole single-rank master tensor of the parameter at position `index` of the
// single-rank GPTModel::parameters() is drawn from Philox stream 1000 + index (N(0, std); the
// output projections N(0, std/sqrt(2L)); biases 0; LayerNorm weights 1) and this rank's
// tensor-parallel slice is kept.
void init_gpt_parameter(Parameter& p, size_t index, const GPTConfig& cfg, uint64_t seed,
                        const TensorParallel& tp);

struct LayerContext;
struct ContextParallel;
// The layer context of one pass over `tokens` (int32 [batch, seq]) with the checks GPTModel and
// the pipeline stages share: the sequence fits the position table, splits over TP under
// sequence parallelism and into two chunks under context parallelism; attention_start (if
// defined) is int32 with the tokens' shape.
class VocabParallelOutput;
// Labels int32 and loss mask float32, both with the tokens' shape, or a megatron::Error.
void check_gpt_targets(const GPTInputs& in);
// The language-model loss of final hidden states xf ([N, h], or this rank's [N/T, h] under
// sequence parallelism) through `output`: the mask-weighted sum and the token count; with dxf
// also its gradient (and the word-embedding grad, +=).
LossResult masked_lm_loss(VocabParallelOutput& output, const Tensor& xf, const GPTInputs& in,
                          float grad_scale, Tensor* dxf);
LayerContext make_layer_context(const GPTConfig& cfg, uint64_t seed, const TensorParallel& tp,
                                const ContextParallel& cp, const Tensor& tokens,
                                const Tensor& attention_start, bool training, bool save,
                                uint64_t dropout_offset);

}  // namespace megatron::model
