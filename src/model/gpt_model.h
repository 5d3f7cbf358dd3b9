// GPTModel (Megatron-Core's GPTModel(pre_process, post_process)): the one transformer model
// class. An instance holds one model chunk of a pipeline (pipeline_layout.h): the embedding when
// it is the first virtual stage (pre_process), its decoder layers, and the final norm with the
// output layer and loss when it is the last (post_process). Without pipelining it is the whole
// model. The layers come from the layer spec (layer_spec.h) of the configuration, so GPT-2-style
// and Llama-style models (and the encoders and mixtures that build on them) are the same class.
//
// Activations are batch-first: a micro-batch of b sequences of s tokens is a [b*s, h] row-major
// matrix (token (bi, si) is row bi*s + si). Every layer owns its Parameters (value in
// params_dtype, fp32 grad accumulated +=); compute is fp32 (bf16/fp16 weights are converted once
// per call into an fp32 working copy, which an inference model drops after each module). Parameter names and shapes follow Megatron-Core
// (embedding.word_embeddings.weight, decoder.layers.{i}.self_attention.linear_qkv.weight, ...;
// decoder layers keep their global numbers in every chunk). Logits span the padded vocabulary.
// Dropout masks are pure functions of (seed, dropout_offset, layer, site, element), so
// recomputation and resume reproduce them exactly.
//
// Micro-batches in flight: forward(mb, ...) keeps what backward needs in a per-micro-batch stash
// (the layers' declared saved activations, module.h), so a pipeline schedule can run several
// forwards before their backwards; backward(mb, ...) puts them back. The last chunk
// differentiates the loss head (fused vocab-parallel cross entropy) already in forward and keeps
// only the gradient of the decoder output.
//
// Tensor parallelism (Megatron 1-D TP, optional sequence parallelism): every rank of the group
// runs the same micro-batches; parameters() are this rank's shards under the single-rank names
// (layout: tensor_parallel.h); losses and logits equal the single-rank model's. Initialisation
// draws each whole master weight exactly as the single-rank model does and keeps this rank's
// slice (TP-size invariant, like --use-cpu-initialization).
// Context parallelism (context_parallel.h): every rank of a CP group is given its own slice of
// the micro-batch (slice_for_context_parallel); losses and gradients are this rank's partial
// sums, which the caller sums over the (data x) context parallel group; rotary positions are the
// tokens' positions in the whole sequence.
// Pipeline parallelism with tied embeddings: the last stage cannot read the first stage's table,
// so its output layer holds a copy, "output_layer.weight" (Parameter::shared), initialised equal
// and kept equal by summing the two gradients over the embedding group (gpt_stage.h).
// Inference: forward_inference runs the same layers with a KV cache (inference_context.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/parallel_state.h"
#include "core/tensor.h"
#include "model/context_parallel.h"
#include "model/parameter.h"
#include "model/pipeline_layout.h"
#include "model/tensor_parallel.h"
#include "model/transformer_config.h"

namespace megatron::model {

// The model's configuration under its historical name (the GPT is the transformer's decoder).
using GPTConfig = TransformerConfig;

struct InferenceContext;
struct LayerContext;

struct GPTInputs {
  Tensor tokens;           // [b, s] int32
  Tensor position_ids;     // [b, s] int32 (read with learned absolute position embeddings)
  Tensor attention_start;  // [b, s] int32 (query i attends keys start[i]..i) or undefined = causal
  Tensor labels;           // [b, s] int32
  Tensor loss_mask;        // [b, s] float32
  Tensor padding_mask;     // [b, s] int32 or undefined: 0 marks padding keys (bidirectional)
};

// CP rank `rank` of `size`'s part of a micro-batch: every [b, S] tensor becomes [b, S/size], the
// columns of chunks rank and 2*size-1-rank of the 2*size chunks (context_parallel.h); position
// ids and attention starts keep their values (positions in the whole sequence). Error unless S is
// divisible by 2*size. size 1: `in` itself.
GPTInputs slice_for_context_parallel(const GPTInputs& in, int rank, int size);

// Megatron's forward pre-hook: called during every forward pass (training, evaluation, logits)
// with a module's parameters just before the module first reads them, in forward order: the
// embedding (word table, which a tied output layer reads too, and position table), each
// transformer layer, the final norm and the output layer's own weight. The module's working
// weights are refreshed from the parameters right after the call, so the hook may still be
// bringing the parameter values in. --overlap-param-gather uses it to wait for the all-gather of
// the buckets holding them (optim::ParamAndGradBuffer::wait_params) while the gathers of later
// layers go on. The hook must not throw part-way on one rank only.
using ForwardPreHook = std::function<void(const ParameterList& params)>;
// Called inside backward as soon as a group of parameters has received its last gradient
// contribution of the micro-batch, in reverse model order: the final norm and the output layer's
// own weight (their gradients were finished by the forward, which differentiates the loss head),
// each layer from the last to the first, then the embedding (word table incl. a tied output
// layer's part, position table). The trainer uses it to start the data-parallel reduction of a
// bucket while backward goes on (--overlap-grad-reduce). An empty function disables it.
using GradReadyHook = std::function<void(const ParameterList& ready)>;

// Calls `hook` (a forward pre-hook or a grad-ready hook) with the parameters of `module`
// (anything with parameters(ParameterList&)); nothing when the hook is empty or the module has
// no parameters of its own (a tied output layer).
template <class Module>
void call_with_parameters(const std::function<void(const ParameterList&)>& hook, Module& module) {
  if (!hook) return;
  ParameterList ps;
  module.parameters(ps);
  if (!ps.empty()) hook(ps);
}

struct LossResult {
  double loss_sum = 0;    // sum over tokens of loss * mask
  double num_tokens = 0;  // sum of mask
};

// Per-call settings of a chunk's forward.
struct ChunkForward {
  bool training = true;         // dropout on, keep activations for backward
  float grad_scale = 1.0f;      // last chunk: backward differentiates grad_scale * sum(loss * mask)
  uint64_t dropout_offset = 0;  // < 2^40, one per micro-batch (e.g. iteration * M + microbatch)
};

// Which chunk an instance holds and how it is built.
struct ModelChunk {
  PipelineLayout layout;  // default: one stage, one chunk (the whole model)
  int pp_rank = 0, chunk = 0;
};
struct ModelOptions {
  // Allocate gradients (training). false (inference): the model only runs forward, so the fp32
  // working copies of bf16/fp16 weights are made just before each module runs and dropped after
  // it; between calls the weights take their own precision's bytes (weight_bytes()).
  bool grad = true;
  bool init_weights = true;  // draw Megatron's initial weights (false: zeros, to be loaded)
  // Where parameters, gradients and activations live: inputs must be on it; everything the
  // model allocates follows it (initial weights are drawn on the host and copied over).
  Device device = Device::cpu();
};

class GPTModel {
 public:
  // The whole model on one rank, or over a tensor-parallel group, or over tensor- and
  // context-parallel groups (each a group of one when unused). Collective over the groups.
  GPTModel(const TransformerConfig& cfg, uint64_t seed);
  GPTModel(const TransformerConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group);
  GPTModel(const TransformerConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group,
           std::shared_ptr<Communicator> cp_group);
  GPTModel(const TransformerConfig& cfg, uint64_t seed, const ParallelState& parallel)
      : GPTModel(cfg, seed, parallel.group_ptr(GroupKind::TP), parallel.group_ptr(GroupKind::CP)) {}
  // One chunk of a pipeline (or, with the default ModelChunk, the whole model). cfg.num_layers is
  // the whole model's and must equal chunk.layout.num_layers.
  GPTModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
           const ContextParallel& cp, const ModelChunk& chunk, const ModelOptions& options = {});
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // This chunk's parameters (shards under TP) in single-rank order: embedding.word_embeddings
  // (and position_embeddings), then per layer input_layernorm.{weight,bias},
  // self_attention.linear_qkv.{weight,bias}, [q_layernorm, k_layernorm],
  // self_attention.linear_proj.{weight,bias}, pre_mlp_layernorm.{weight,bias},
  // mlp.linear_fc1.{weight,bias}, mlp.linear_fc2.{weight,bias} (biases only where the config has
  // them), then decoder.final_layernorm and output_layer.weight (untied, or the last stage's copy
  // of a tied table).
  ParameterList parameters();

  bool pre_process() const;   // holds the embedding: takes tokens
  bool post_process() const;  // holds the final norm and output layer: gives the loss
  int first_layer() const;
  int num_layers() const;     // layers held here
  // Rows of the activation this chunk receives and sends for a micro-batch of b x s tokens:
  // b*s, or b*s/T under sequence parallelism.
  int64_t activation_rows(int64_t batch, int64_t seq) const;

  // ---- pipeline interface (pipeline/forward_backward.h)
  // Forward of micro-batch `microbatch` (an id, unique among those in flight). The first chunk
  // reads in.tokens / in.position_ids (x is ignored); the others take x, the previous chunk's
  // output [activation_rows, h]. Every chunk reads in.tokens' shape and the masks; the last reads
  // in.labels / in.loss_mask. Returns the output activation, or, on the last chunk, an undefined
  // tensor with *loss filled (loss must then be non-null). With opt.training the micro-batch stays
  // in flight until backward.
  Tensor forward(int64_t microbatch, const GPTInputs& in, const Tensor& x, const ChunkForward& opt,
                 LossResult* loss = nullptr);
  // Backward of an in-flight micro-batch: dy is the gradient of this chunk's output (ignored on
  // the last chunk, whose output is the loss). Gradients are ADDED into Parameter::grad. Returns
  // the gradient of the input activation (undefined on the first chunk).
  Tensor backward(int64_t microbatch, const Tensor& dy);
  int in_flight() const;  // micro-batches forwarded but not yet backwarded

  void set_forward_pre_hook(ForwardPreHook hook);
  // Applies to the backward passes run while it is set (the schedule sets it for the chunk's last
  // micro-batch only). Every parameter of the chunk is reported once per backward.
  void set_grad_ready_hook(GradReadyHook hook);
  // The word-embedding table (first chunk) or the last chunk's tied copy of it; null otherwise
  // and when the output layer is untied.
  Parameter* word_embedding();

  // ---- the whole model (pre_process and post_process; tests, evaluation, tools)
  // Training micro-batch: forward + backward. Gradients of grad_scale * sum(loss * mask) are
  // ADDED into Parameter::grad.
  LossResult forward_backward(const GPTInputs& in, float grad_scale, uint64_t dropout_offset);
  // Evaluation: no dropout, nothing saved for backward. labels/loss_mask required.
  LossResult forward_loss(const GPTInputs& in);
  // [b, s, padded_vocab] fp32 logits, no dropout. Under TP the vocabulary shards are gathered.
  // padding_mask: as GPTInputs::padding_mask (bidirectional models), or undefined.
  Tensor forward_logits(const Tensor& tokens, const Tensor& position_ids,
                        const Tensor& attention_start = Tensor(),
                        const Tensor& padding_mask = Tensor());
  // Generation: tokens int32 [n] are appended to the KV cache at inference.row_slot /
  // inference.row_pos (int32 [n] each, set by the caller); returns the logits [k, V] of the rows
  // listed in logit_rows (int32 [k]). All of them on device(). The whole model without tensor or
  // context parallelism.
  Tensor forward_inference(const Tensor& tokens, InferenceContext& inference,
                           const Tensor& logit_rows);
  // Sizes `inference`'s caches for this model: `slots` sequences of up to `max_len` positions.
  void allocate_inference(InferenceContext& inference, int64_t slots, int64_t max_len) const;

  // Sums the gradients of the parameters whose gradients are partial sums over the TP group
  // (sequence-parallel norms and row-parallel biases, position embedding; per-head q/k norms):
  // call once per step after the last micro-batch's backward. Collective over the TP group.
  void all_reduce_sequence_parallel_grads();

  const TransformerConfig& config() const;
  int tensor_parallel_size() const;
  int tensor_parallel_rank() const;
  int context_parallel_size() const;
  int context_parallel_rank() const;
  bool sequence_parallel() const;  // config().sequence_parallel && TP > 1
  Device device() const;           // ModelOptions::device
  // Peak bytes of activations held for backward during the last forward_backward (every
  // declared saved activation and recompute block input; workspaces and the loss head's logits
  // chunk excluded).
  size_t activation_bytes() const;
  // Bytes of the distinct storages held by this chunk's parameter values and their fp32 working
  // copies now (a tied output layer's table counted once).
  size_t weight_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Megatron's initial value of a parameter: the whole single-rank master tensor of the parameter at
// position `index` of the single-rank GPTModel::parameters() is drawn from Philox stream
// 1000 + index (N(0, std); the output projections N(0, std/sqrt(2L)); biases 0; norm weights 1,
// or 0 with --apply-layernorm-1p) and this rank's tensor-parallel slice is kept.
void init_gpt_parameter(Parameter& p, size_t index, const TransformerConfig& cfg, uint64_t seed,
                        const TensorParallel& tp);

// Labels int32 and loss mask float32, both with the tokens' shape, or a megatron::Error.
void check_gpt_targets(const GPTInputs& in);

}  // namespace megatron::model
