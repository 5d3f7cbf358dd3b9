// What every layer shares:
//  - LayerContext: the per-call state (training, saving, dropout streams, batch geometry, masks,
//    rotary positions, the inference context with the KV cache);
//  - Weight: a Parameter with the fp32 working copy compute reads (linear layers multiply bf16
//    weights as they are: Weight::read_as_stored);
//  - Module: the base of every layer. A module owns its weights and its child modules (both
//    registered in construction order, which is the parameter order of checkpoints and of the
//    initialisation streams), and declares each activation it keeps from forward for backward
//    once, as a SavedTensor member with its name and shape:
//        SavedTensor qkv_{this, "qkv", "[N, qkv width]"};
//    Everything that needs the saved activations works from those declarations: the bytes held
//    (activation memory), dropping them (full recomputation) and moving a micro-batch's
//    activations out and back in (take_saved / restore_saved: pipeline schedules keep several
//    micro-batches in flight).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "model/parameter.h"

namespace megatron::model {

struct InferenceContext;

// Per-call state every layer sees. batch and seq are the full micro-batch: under sequence
// parallelism a layer's input may hold only a block of its rows (see parallel_layers.h).
struct LayerContext {
  bool training = false;  // dropout active
  bool save = false;      // keep activations for backward
  bool recompute_core_attention = false;  // selective recompute: no s x s probabilities kept
  uint64_t seed = 0, dropout_offset = 0;
  int64_t batch = 0, seq = 0;
  Tensor attention_start;  // [b, s] int32 or undefined: query i attends keys start[i].. (resets)
  Tensor key_padding;      // [b, s] int32 or undefined: 0 marks a padding key (bidirectional)
  // Rotary positions of the rows ([b*s] int32, row bi*s + i): the token's position in the whole
  // sequence (its context-parallel position; at inference its cache position). Set when the
  // model uses rotary embeddings.
  Tensor rope_positions;
  // Generation with a KV cache (inference_context.h); null in training and evaluation.
  InferenceContext* inference = nullptr;
  // ---- a block's extra inputs (encoder-decoder models, relative position bias)
  // Added to every layer number in the dropout streams: a second block of the same model (T5's
  // decoder after its encoder) draws masks of its own.
  int layer_offset = 0;
  // Self-attention's additive score bias [1, local heads, seq, seq] fp32 (a relative position
  // bias), or undefined; backward ADDS the gradient into attention_bias_grad (same shape).
  Tensor attention_bias, attention_bias_grad;
  // Cross-attention's keys and values come from `context` [batch * context_seq, h] (the encoder's
  // output; whole rows on every tensor-parallel rank, or this rank's row shard under sequence
  // parallelism), with the key padding context_padding
  // [batch, context_seq] int32 (0: padding) or undefined; backward ADDS d(context) into
  // context_grad (same shape as context).
  Tensor context, context_grad, context_padding;
  int64_t context_seq = 0;
  // Context parallelism (context_parallel.h): seq is this rank's S/C tokens (chunks cp_rank and
  // 2*cp_size-1-cp_rank of the sequence). Dropout masks are indexed by the element's position in
  // the unsplit tensors (for_each_sequence_run), so they do not depend on CP either.
  int cp_rank = 0, cp_size = 1;
  // Mixture of experts: the factor of the auxiliary losses' gradients (Megatron's
  // MoEAuxLossAutoScaler.main_loss_backward_scale: loss scale / micro-batches).
  double moe_aux_grad_scale = 1.0;
  // Dropout stream for (micro-batch offset, layer, site): stream = offset << 24 | layer << 4 |
  // site, so every mask is a pure function of (seed, offset, layer, site, element).
  // element_offset: index of the first element of the tensor this mask covers within the whole
  // (unsharded) tensor, for a sequence-parallel shard.
  ops::DropoutSpec dropout(float p, int layer, int site, uint64_t element_offset = 0) const;
  int64_t rows() const { return batch * seq; }
  // Calls fn(first, n, element_offset) for each run of rows [row0, row0 + rows) of this rank's
  // [batch*seq, width] activation that is contiguous in the unsplit [batch*seq*cp_size, width]
  // one: rows row0 + first .. + n, whose first element has index element_offset there. Without
  // context parallelism that is one run (0, rows, row0 * width).
  template <class Fn>
  void for_each_sequence_run(int64_t row0, int64_t rows, int64_t width, Fn&& fn) const {
    if (cp_size == 1) {
      fn(int64_t(0), rows, uint64_t(row0 * width));
      return;
    }
    const int64_t half = seq / 2, end = row0 + rows;
    for (int64_t r = row0; r < end;) {
      const int64_t bi = r / seq, i = r % seq;
      const int64_t n = std::min(end, bi * seq + (i < half ? half : seq)) - r;
      const int64_t global_row = bi * seq * cp_size + context_parallel_position(i, seq, cp_rank, cp_size);
      fn(r - row0, n, uint64_t(global_row * width));
      r += n;
    }
  }
};

enum DropoutSite : int { kSiteEmbedding = 0, kSiteAttentionProbs = 1, kSiteAttentionOut = 2,
                         kSiteMlpOut = 3, kSiteCrossAttentionProbs = 4,
                         kSiteCrossAttentionOut = 5 };

size_t bytes_of(const Tensor& t);

// A weight as layers use it: the Parameter plus the fp32 copy used in compute.
struct Weight {
  Parameter param;
  Tensor f32;  // fp32 view/copy of param.value (+ offset)
  // Added to the stored value in the working copy: 1 for a zero-centred norm weight
  // (--apply-layernorm-1p stores gamma - 1), else 0.
  float offset = 0.0f;
  // Creates the parameter from its spec: `shape` is this rank's shard (WeightSpec::partition_dim
  // tells how it is cut from the single-rank tensor). Without `grad` (inference) no gradient is
  // allocated.
  void init(WeightSpec spec, const Shape& shape, DType dtype, bool grad = true);
  // Set by the layers whose ops all read the weight in its own dtype (the linear layers'
  // products, the word table's lookups and products): where ops::gemm computes in that dtype on
  // the weight's device (bf16 on the CPU) they read param.value and refresh() makes no fp32 copy.
  bool read_as_stored = false;
  bool defined() const { return param.value.defined(); }
  void refresh();  // param.value (+ offset) -> f32 (no copy for fp32 params without offset)
  void release();  // drops an f32 copy (an fp32 value stays its own view); refresh() makes it again
  // What the weight's products (and, with read_as_stored, its other ops) read: param.value where
  // gemm computes in its dtype, else the fp32 working copy.
  const Tensor& operand() const;
};

class Module;

// One activation a module keeps from its forward for its backward (see the file comment).
class SavedTensor {
 public:
  SavedTensor(Module* owner, const char* name, const char* shape);
  SavedTensor(const SavedTensor&) = delete;
  SavedTensor& operator=(const SavedTensor&) = delete;
  SavedTensor& operator=(Tensor t) {
    value = std::move(t);
    return *this;
  }
  operator const Tensor&() const { return value; }  // NOLINT: reads like the tensor it holds
  const Tensor& get() const { return value; }
  bool defined() const { return value.defined(); }
  void reset() { value = Tensor(); }
  const char* name;
  const char* shape;  // documentation: shape in terms of rows N, widths, heads
  Tensor value;
};

// The activations of a module tree moved out of it (Module::take_saved), in declaration order.
using ActivationStash = std::vector<Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // This module's weights, then its children's, in registration order.
  void parameters(ParameterList& out);
  ParameterList parameters();
  // Refreshes the fp32 working copies of this module's and its children's weights.
  virtual void refresh_working_weights();
  // Drops the fp32 working copies of half-precision weights (a model that only runs forward keeps
  // its weights' footprint at their own precision between modules); refresh_working_weights()
  // makes them again.
  void release_working_weights();
  // Appends this module's and its children's parameter values and fp32 working copies (a copy
  // that is a view of its value shares its storage) to `out`, for held_bytes.
  void weight_tensors(std::vector<Tensor>& out) const;

  // Every activation this module and its children hold for backward.
  void for_each_saved(const std::function<void(const SavedTensor&)>& fn) const;
  ActivationStash take_saved();           // moves them out; the modules are left empty
  void restore_saved(ActivationStash&& s);  // puts a stash taken from this module back

 protected:
  Weight& register_weight(Weight& w);  // after w.init; undefined weights are skipped
  void register_child(Module& m);

 private:
  friend class SavedTensor;
  std::vector<Weight*> weights_;
  std::vector<Module*> children_;
  std::vector<SavedTensor*> saved_;
};

// Bytes of the distinct storages of `tensors` and of the saved activations of `modules`.
size_t held_bytes(const std::vector<const Module*>& modules, const std::vector<Tensor>& tensors);

}  // namespace megatron::model
