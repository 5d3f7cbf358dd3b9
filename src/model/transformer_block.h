// A stack of transformer layers (Megatron-Core's TransformerBlock): built from one layer spec per
// layer (layer_spec.h; layers may differ) under a name ("decoder", "encoder": parameters are
// <name>.layers.<i>. and <name>.final_layernorm.), optionally ending with the final norm. It owns
// what every model family needs around its layers:
//   - full recomputation ("uniform": groups of k layers, "block": the first k layers of the chunk),
//     keeping only block inputs in forward and rerunning the block before its backward (same
//     dropout streams, hence identical masks); selective recomputation is the layers' own;
//   - the per-micro-batch stash: a training forward moves every layer's saved activations into a
//     BlockStash the caller keeps per micro-batch in flight, and backward puts them back;
//   - the hooks and the working-weight lifecycle of each module (ModuleHooks).
// One forward path serves training, evaluation and generation (the LayerContext says which).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model_chunk.h"
#include "model/norm.h"
#include "model/transformer_layer.h"

namespace megatron::model {

// What happens around each module of a chunk: before its forward the pre-hook with its parameters
// and a refresh of its working weights; after it, in a model without gradients, the fp32 working
// copies of half-precision weights are dropped again; after its backward the grad-ready hook.
struct ModuleHooks {
  ForwardPreHook pre_hook;
  GradReadyHook grad_ready;
  bool transient_working_weights = false;  // !ModelOptions::grad
  void before_forward(Module& m) const {
    call_with_parameters(pre_hook, m);
    m.refresh_working_weights();
  }
  void after_forward(Module& m) const {
    if (transient_working_weights) m.release_working_weights();
  }
  void after_backward(Module& m) const { call_with_parameters(grad_ready, m); }
};

// A micro-batch's activations held by a block between its forward and backward.
struct BlockStash {
  std::vector<ActivationStash> layers;  // per layer (empty for recomputed ones)
  std::vector<Tensor> block_inputs;     // per recompute group (its input; undefined otherwise)
  void append_tensors(std::vector<Tensor>& out) const;
};

class TransformerBlock : public Module {
 public:
  // `specs`: one per layer of this block (or of this pipeline chunk of it), whose global numbers
  // start at first_layer. `hooks` must outlive the block (the owning chunk's).
  TransformerBlock(const std::string& name, const TransformerConfig& cfg,
                   std::vector<TransformerLayerSpec> specs, int first_layer, bool final_norm,
                   const TensorParallel& tp, const ContextParallel& cp, bool grad,
                   const ModuleHooks& hooks);

  // The layers over x ([R, h]); with ctx.save their activations go into *stash (non-null), which
  // backward takes back. Does not apply the final norm (final_norm_forward).
  Tensor forward(const LayerContext& ctx, const Tensor& x, BlockStash* stash);
  // Gradient of the layers' input from the gradient of their output. `live` is told, after each
  // recomputed group's forward, which layers now hold activations again (activation accounting).
  Tensor backward(const LayerContext& ctx, const Tensor& dy, BlockStash& stash,
                  const std::function<void(const std::vector<const Module*>& live)>& live = {});

  bool has_final_norm() const { return final_layernorm_ != nullptr; }
  Norm& final_layernorm() { return *final_layernorm_; }
  // The final norm's forward (its activations stay in the norm), and its backward right after:
  // the loss head differentiates itself in the forward, so the norm's saved input never outlives
  // the micro-batch's forward.
  Tensor final_norm_forward(const LayerContext& ctx, const Tensor& x);
  Tensor final_norm_backward(const LayerContext& ctx, const Tensor& dxf);

  int first_layer() const { return first_layer_; }
  int num_layers() const { return int(layers_.size()); }
  TransformerLayer& layer(int i) { return *layers_.at(size_t(i)); }

 private:
  struct RecomputeGroup {
    int begin, end;  // local layer indices
    bool recompute;
  };
  int first_layer_;
  const ModuleHooks& hooks_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_layernorm_;
  std::vector<RecomputeGroup> groups_;
};

}  // namespace megatron::model
