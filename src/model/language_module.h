// What the language-model families share (Megatron-Core's LanguageModule): the embedding
// (word table, learned positions, token types; first chunk), one transformer block (the chunk's
// layers, and the final norm on the last chunk), the micro-batches in flight, the hooks and the
// working-weight lifecycle, the layer context of a pass and the initial weights. A family
// (gpt_model.h, bert_model.h) adds its loss head: the modules after the final norm, their loss
// and logits. Adding a family is a class deriving from this one with its head and layer spec.
//
// Tensor parallelism (Megatron 1-D TP, optional sequence parallelism): every rank of the group
// runs the same micro-batches; parameters() are this rank's shards under the single-rank names
// (layout: tensor_parallel.h); losses and logits equal the single-rank model's. Initialisation
// draws each whole master weight exactly as the single-rank model does (stream 1000 + the
// weight's position in the single-rank parameters(); weight_init.h) and keeps this rank's slice.
// Context parallelism (context_parallel.h): every rank of a CP group is given its own slice of the
// micro-batch (slice_for_context_parallel); losses and gradients are this rank's partial sums,
// which the caller sums over the (data x) context parallel group.
// Pipeline parallelism with tied embeddings: the last stage cannot read the first stage's table,
// so its output layer holds a copy, "output_layer.weight" (WeightSpec::shared), initialised equal
// and kept equal by summing the two gradients over the embedding group (stage_model.h).
// Dropout masks are pure functions of (seed, dropout_offset, layer, site, element), so
// recomputation and resume reproduce them exactly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/context_parallel.h"
#include "model/model_chunk.h"
#include "model/parallel_layers.h"
#include "model/tensor_parallel.h"
#include "model/transformer_block.h"
#include "model/transformer_config.h"

namespace megatron::model {

class LanguageModule : public ModelChunk {
 public:
  ~LanguageModule() override;

  // ---- ModelChunk
  ParameterList parameters() override;
  bool pre_process() const override { return embedding_ != nullptr; }
  bool post_process() const override { return post_process_; }
  int hidden_size() const override { return cfg_.hidden_size; }
  int64_t activation_rows(int64_t batch, int64_t seq) const override;
  Device device() const override { return device_; }
  Tensor forward(int64_t microbatch, const Batch& in, const Tensor& x, const ChunkForward& opt,
                 LossResult* loss = nullptr) override;
  Tensor backward(int64_t microbatch, const Tensor& dy) override;
  int in_flight() const override { return int(in_flight_.size()); }
  void set_forward_pre_hook(ForwardPreHook hook) override { hooks_.pre_hook = std::move(hook); }
  void set_grad_ready_hook(GradReadyHook hook) override { hooks_.grad_ready = std::move(hook); }
  Parameter* word_embedding() override;

  // ---- the whole model (pre_process and post_process; tests, evaluation, tools)
  // Training micro-batch: forward + backward. Gradients of grad_scale * the micro-batch's loss
  // (loss_reduction()) are ADDED into Parameter::grad.
  LossResult forward_backward(const Batch& in, float grad_scale, uint64_t dropout_offset);
  // Evaluation: no dropout, nothing saved for backward. The labels the family reads are required.
  LossResult forward_loss(const Batch& in);
  // [b, s, padded_vocab] fp32 language-model logits, no dropout. Under TP the vocabulary shards
  // are gathered. Only the input fields are read (tokens, positions, masks, token types).
  virtual Tensor forward_logits(const Batch& in);
  Tensor forward_logits(const Tensor& tokens, const Tensor& position_ids,
                        const Tensor& attention_start = Tensor(),
                        const Tensor& padding_mask = Tensor());

  // Sums the gradients of the parameters whose gradients are partial sums over the TP group
  // (WeightSpec::sequence_parallel): call once per step after the last micro-batch's backward.
  // Collective over the TP group.
  void all_reduce_sequence_parallel_grads();

  const TransformerConfig& config() const { return cfg_; }
  // This chunk's mixture-of-experts layers, in layer order (none in a dense model).
  std::vector<MoELayer*> moe_layers();
  int first_layer() const { return block_->first_layer(); }
  int num_layers() const { return block_->num_layers(); }  // layers held here
  int tensor_parallel_size() const { return tp_.size(); }
  int tensor_parallel_rank() const { return tp_.rank(); }
  int context_parallel_size() const { return cp_.size(); }
  int context_parallel_rank() const { return cp_.rank(); }
  bool sequence_parallel() const { return tp_.sequence_parallel; }
  // Peak bytes of activations held for backward during the last forward_backward (every
  // declared saved activation and recompute block input; workspaces and the loss head's logits
  // chunk excluded).
  size_t activation_bytes() const { return activation_bytes_; }
  // Bytes of the distinct storages held by this chunk's parameter values and their fp32 working
  // copies now (a tied output layer's table counted once).
  size_t weight_bytes() const;

 protected:
  // The embedding (first chunk: word table, learned positions when the configuration has them,
  // `num_tokentypes` token types) and the block `block_name` of the chunk's layers, one spec
  // per layer of the whole model (the chunk takes its own), with the final norm on the last
  // chunk. The family builds its head, then calls finish(options).
  LanguageModule(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                 const ContextParallel& cp, const ChunkPlace& place, const ModelOptions& options,
                 const std::string& block_name, const std::vector<TransformerLayerSpec>& specs,
                 int num_tokentypes);
  // Draws the initial weights (options.init_weights) and moves everything to the device.
  void finish(const ModelOptions& options);

  // ---- the family's loss head (last chunk)
  // Its modules, in parameter order.
  virtual std::vector<Module*> head_modules() = 0;
  // The losses of the final hidden states xf ([R, h]: this rank's rows); with dxf non-null also
  // d(grad_scale * loss)/dxf into *dxf and the head's parameter gradients (+=). Each head module
  // runs between hooks().before_forward and after_forward.
  virtual LossResult head_loss(const LayerContext& ctx, const Tensor& xf, const Batch& in,
                               float grad_scale, Tensor* dxf) = 0;
  // [rows of xf, padded_vocab] fp32 LM logits of final hidden states, gathered over TP.
  virtual Tensor head_logits(const LayerContext& ctx, const Tensor& xf) = 0;

  // The output layer over the padded vocabulary (last chunk), optionally with a bias: tied to the
  // word table when this chunk holds it, else its own weight (untied, or the last stage's shared
  // copy). The family lists it among its head modules.
  OutputLayer& make_output_layer(bool bias);
  // Before and after the output layer's forward: the hooks, plus the working copy of a tied table
  // that an inference model dropped after the embedding.
  void output_before_forward();
  void output_after_forward();

  // The layer context of one pass over `in` with the checks every chunk shares (see .cpp).
  LayerContext make_ctx(const Batch& in, bool training, bool save, uint64_t offset) const;
  const ModuleHooks& hooks() const { return hooks_; }
  // Every module of the chunk (embedding, block, head modules; a family with more overrides it),
  // and the initial weights of its parameters (each from its stream; see the .cpp).
  virtual std::vector<Module*> modules();
  virtual void init_weights();
  // The embedding's output for `in` (first chunk).
  Tensor embed(const LayerContext& ctx, const Batch& in);

  TransformerConfig cfg_;
  uint64_t seed_;
  TensorParallel tp_;
  ContextParallel cp_;
  Device device_;
  ModuleHooks hooks_;
  std::unique_ptr<Embedding> embedding_;  // first chunk
  std::unique_ptr<TransformerBlock> block_;
  std::unique_ptr<OutputLayer> output_layer_;  // last chunk (make_output_layer)
  bool post_process_ = false;
  int num_tokentypes_ = 0;
  // Layers of the whole model (for the initialisation streams of the weights after them).
  std::vector<TransformerLayerSpec> all_specs_;

 private:
  struct InFlight {
    LayerContext ctx;
    ActivationStash embedding;
    BlockStash block;
    Tensor dout;  // last chunk: grad of the block's output
  };
  void move_to_device();
  size_t held(const InFlight& st, const std::vector<const Module*>& live) const;

  std::map<int64_t, InFlight> in_flight_;
  size_t activation_bytes_ = 0;
};

// Labels int32 and loss mask float32, both with the tokens' shape, or a megatron::Error.
void check_lm_targets(const Batch& in);
// The language-model loss of final hidden states xf ([N, h], or this rank's [N/T, h] under
// sequence parallelism) through `output` (Megatron-Core's compute_language_model_loss): the
// mask-weighted sum and the token count; with dxf also the gradient of grad_scale * that sum (and
// the output layer's grads, +=).
LossResult masked_lm_loss(OutputLayer& output, const Tensor& xf, const Batch& in,
                          float grad_scale, Tensor* dxf);

}  // namespace megatron::model
