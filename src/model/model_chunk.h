// The model-chunk interface: what the pipeline schedules (pipeline/forward_backward.h), the stage
// holder (stage_model.h) and the trainer know of a model. A model family (GPTModel, BertModel)
// implements it once for every pipeline stage: an instance holds one model chunk of a pipeline
// (pipeline_layout.h), the embedding when it is the first virtual stage (pre_process), the loss
// head when it is the last (post_process); without pipelining it is the whole model.
//
// Micro-batches in flight: forward(mb, ...) keeps what backward needs in a per-micro-batch stash,
// so a schedule can run several forwards before their backwards; backward(mb, ...) puts it back.
// The last chunk differentiates its loss head already in forward and keeps only the gradient of
// the head's input.
//
// Activations between chunks are batch-first [b*s, h] fp32 rows (token (bi, si) is row bi*s+si),
// or this rank's [b*s/T, h] block under sequence parallelism.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/parameter.h"
#include "model/pipeline_layout.h"

namespace megatron::model {

// One micro-batch as every family reads it; each family reads the fields it uses and ignores the
// rest (undefined tensors are "not given"). All tensors are on the model's device.
struct Batch {
  Tensor tokens;           // [b, s] int32
  Tensor position_ids;     // [b, s] int32 (read with learned absolute position embeddings)
  Tensor attention_start;  // [b, s] int32 (query i attends keys start[i]..i) or undefined = causal
  Tensor labels;           // [b, s] int32 in [0, padded vocab) (any such id outside the loss mask)
  Tensor loss_mask;        // [b, s] float32
  Tensor padding_mask;     // [b, s] int32 or undefined: 0 marks padding (bidirectional models)
  Tensor token_types = {};  // [b, s] int32 or undefined: token-type (segment) ids (BERT)
  // [b] int32 or undefined: a per-sequence class label (BERT's sentence order, "is_random"); -1
  // is ignored by the loss.
  Tensor sequence_labels = {};
  // Encoder-decoder models (T5): tokens, labels and loss_mask above are the decoder's (text_dec,
  // labels, loss_mask of Megatron's T5 batch; the decoder's padding is at its end, where the
  // causal mask already keeps it from every real token), and the encoder reads these.
  Tensor encoder_tokens = {};        // [b, se] int32 (text_enc)
  Tensor encoder_padding_mask = {};  // [b, se] int32 or undefined: 0 marks padding (enc_mask)
};

// CP rank `rank` of `size`'s part of a micro-batch: every [b, S] tensor becomes [b, S/size], the
// columns of chunks rank and 2*size-1-rank of the 2*size chunks (context_parallel.h); position
// ids and attention starts keep their values (positions in the whole sequence); per-sequence
// tensors stay whole. Error unless S is divisible by 2*size. size 1: `in` itself.
Batch slice_for_context_parallel(const Batch& in, int rank, int size);

// Megatron's forward pre-hook: called during every forward pass (training, evaluation, logits)
// with a module's parameters just before the module first reads them, in forward order. The
// module's working weights are refreshed from the parameters right after the call, so the hook may
// still be bringing the parameter values in. --overlap-param-gather uses it to wait for the
// all-gather of the buckets holding them (optim::ParamAndGradBuffer::wait_params). The hook must
// not throw part-way on one rank only.
using ForwardPreHook = std::function<void(const ParameterList& params)>;
// Called inside backward as soon as a group of parameters has received its last gradient
// contribution of the micro-batch, in reverse model order: the loss head's parameters (finished
// by the forward, which differentiates the head), each layer from the last to the first, then the
// embedding. The trainer uses it to start the data-parallel reduction of a bucket while backward
// goes on (--overlap-grad-reduce). An empty function disables it.
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

// One named loss of a micro-batch (an entry of Megatron's loss dict): its value is sum / count.
struct LossTerm {
  double sum = 0, count = 0;
};

// The losses of a micro-batch (or their sums over micro-batches): the first loss, "lm loss", as
// loss_sum / num_tokens, then the family's further losses (ModelChunk::loss_names() from the
// second on) in `more`.
struct LossResult {
  double loss_sum = 0;    // sum over tokens of loss * mask (or, for LossReduction::microbatch_mean,
  double num_tokens = 0;  // the micro-batch's mean loss with count 1)
  std::vector<LossTerm> more = {};
  LossResult& operator+=(const LossResult& o);
};

// How a family's loss over one micro-batch is formed (Megatron's loss_func returning a loss sum
// and its token count, or a scalar that the schedule averages over micro-batches).
enum class LossReduction {
  // The loss is sum(loss * mask); the trainer divides by the token count (pretrain_gpt.py).
  sum_and_count,
  // Each named loss is its own mean over the micro-batch and the micro-batch's loss is their sum
  // (pretrain_bert.py); the trainer divides only by the number of micro-batches (x DP x CP).
  microbatch_mean,
};

// Per-call settings of a chunk's forward.
struct ChunkForward {
  bool training = true;  // dropout on, keep activations for backward
  // Last chunk: backward differentiates grad_scale * (the micro-batch's loss as its
  // loss_reduction() forms it).
  float grad_scale = 1.0f;
  uint64_t dropout_offset = 0;  // < 2^40, one per micro-batch (e.g. iteration * M + microbatch)
  // Mixture of experts: the factor of the auxiliary losses' gradients (LayerContext).
  double moe_aux_grad_scale = 1.0;
};

// Which chunk an instance holds.
struct ChunkPlace {
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

class ModelChunk {
 public:
  virtual ~ModelChunk() = default;

  // This chunk's parameters (shards under TP) in single-rank order.
  virtual ParameterList parameters() = 0;
  virtual bool pre_process() const = 0;   // holds the embedding: takes tokens
  virtual bool post_process() const = 0;  // holds the loss head: gives the loss
  virtual int hidden_size() const = 0;
  // Rows of the activation this chunk receives and sends for a micro-batch of b x s tokens:
  // b*s, or b*s/T under sequence parallelism.
  virtual int64_t activation_rows(int64_t batch, int64_t seq) const = 0;
  virtual Device device() const = 0;

  // Forward of micro-batch `microbatch` (an id, unique among those in flight). The first chunk
  // reads the batch's inputs (x is ignored); the others take x, the previous chunk's output
  // [activation_rows, h]. Every chunk reads the tokens' shape and the masks; the last reads the
  // labels. Returns the output activation, or, on the last chunk, an undefined tensor with *loss
  // filled (loss must then be non-null). With opt.training the micro-batch stays in flight until
  // backward.
  virtual Tensor forward(int64_t microbatch, const Batch& in, const Tensor& x,
                         const ChunkForward& opt, LossResult* loss = nullptr) = 0;
  // Backward of an in-flight micro-batch: dy is the gradient of this chunk's output (ignored on
  // the last chunk, whose output is the loss). Gradients are ADDED into Parameter::grad. Returns
  // the gradient of the input activation (undefined on the first chunk).
  virtual Tensor backward(int64_t microbatch, const Tensor& dy) = 0;
  virtual int in_flight() const = 0;  // micro-batches forwarded but not yet backwarded

  virtual void set_forward_pre_hook(ForwardPreHook hook) = 0;
  // Applies to the backward passes run while it is set (the schedule sets it for the chunk's last
  // micro-batch only). Every parameter of the chunk is reported once per backward.
  virtual void set_grad_ready_hook(GradReadyHook hook) = 0;
  // The word-embedding table (first chunk) or the last chunk's tied copy of it; null otherwise
  // and when the output layer is untied.
  virtual Parameter* word_embedding() = 0;

  // The family's named losses as Megatron logs them ("lm loss", then e.g. "sop loss"), and how
  // its micro-batch loss is formed.
  virtual const std::vector<std::string>& loss_names() const = 0;
  virtual LossReduction loss_reduction() const = 0;
};

}  // namespace megatron::model
