// The layer stack with recomputation, the per-micro-batch stash and the final norm (see
// transformer_block.h).
#include "model/transformer_block.h"

#include <algorithm>
#include <utility>

namespace megatron::model {

void BlockStash::append_tensors(std::vector<Tensor>& out) const {
  for (const ActivationStash& s : layers) out.insert(out.end(), s.begin(), s.end());
  out.insert(out.end(), block_inputs.begin(), block_inputs.end());
}

TransformerBlock::TransformerBlock(const std::string& name, const TransformerConfig& cfg,
                                   std::vector<TransformerLayerSpec> specs, int first_layer,
                                   bool final_norm, const TensorParallel& tp,
                                   const ContextParallel& cp, bool grad, const ModuleHooks& hooks)
    : first_layer_(first_layer), hooks_(hooks) {
  MG_CHECK(!specs.empty(), "TransformerBlock ", name, ": no layers");
  for (size_t i = 0; i < specs.size(); ++i) {
    layers_.push_back(std::make_unique<TransformerLayer>(first_layer + int(i), cfg, specs[i], tp,
                                                         cp, grad, name));
    register_child(*layers_.back());
  }
  if (final_norm) {
    NormOptions no;
    no.eps = cfg.layernorm_epsilon;
    no.zero_centered_gamma = cfg.apply_layernorm_1p;
    no.partial_grad = tp.sequence_parallel;
    no.grad = grad;
    final_layernorm_ = std::make_unique<Norm>(name + ".final_layernorm", cfg.hidden_size,
                                              *specs.back().pre_mlp_layernorm, cfg.params_dtype, no);
    register_child(*final_layernorm_);
  }
  // Full recomputation works per chunk, as Megatron's TransformerBlock does per stage: "uniform"
  // recomputes groups of k of this chunk's layers, "block" the first k of them.
  const int n = int(layers_.size()), k = cfg.recompute_num_layers;
  if (cfg.full_recompute() && cfg.recompute_method_id() == RecomputeMethodId::uniform) {
    for (int i = 0; i < n; i += k) groups_.push_back({i, std::min(n, i + k), true});
  } else {
    const int nrec = cfg.full_recompute() ? k : 0;
    for (int i = 0; i < n; ++i) groups_.push_back({i, i + 1, i < nrec});
  }
}

Tensor TransformerBlock::forward(const LayerContext& ctx, const Tensor& x_in, BlockStash* stash) {
  MG_CHECK(!ctx.save || stash != nullptr, "TransformerBlock::forward: saving needs a stash");
  LayerContext nosave = ctx;
  nosave.save = false;
  if (ctx.save) {
    stash->layers.assign(layers_.size(), {});
    stash->block_inputs.assign(groups_.size(), Tensor());
  }
  Tensor x = x_in;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const RecomputeGroup& grp = groups_[g];
    const bool rec = ctx.save && grp.recompute;
    if (rec) stash->block_inputs[g] = x;
    for (int l = grp.begin; l < grp.end; ++l) {
      TransformerLayer& layer = *layers_[size_t(l)];
      hooks_.before_forward(layer);
      x = layer.forward(rec ? nosave : ctx, x);
      if (ctx.save && !rec) stash->layers[size_t(l)] = layer.take_saved();
      if (!ctx.save) hooks_.after_forward(layer);
    }
  }
  return x;
}

Tensor TransformerBlock::backward(const LayerContext& ctx, const Tensor& dy, BlockStash& stash,
                                  const std::function<void(const std::vector<const Module*>&)>& live) {
  MG_CHECK(stash.layers.size() == layers_.size() && stash.block_inputs.size() == groups_.size(),
           "TransformerBlock::backward: the stash is not this block's");
  Tensor dx = dy;
  for (size_t g = groups_.size(); g-- > 0;) {
    const RecomputeGroup& grp = groups_[g];
    if (grp.recompute) {  // rerun the group's forward with saving on (same dropout streams)
      Tensor y = std::exchange(stash.block_inputs[g], Tensor());
      std::vector<const Module*> held;
      for (int l = grp.begin; l < grp.end; ++l) {
        y = layers_[size_t(l)]->forward(ctx, y);
        held.push_back(layers_[size_t(l)].get());
      }
      if (live) live(held);
    }
    for (int l = grp.end; l-- > grp.begin;) {
      TransformerLayer& layer = *layers_[size_t(l)];
      if (!grp.recompute) layer.restore_saved(std::move(stash.layers[size_t(l)]));
      dx = layer.backward(ctx, dx);
      hooks_.after_backward(layer);
    }
  }
  return dx;
}

Tensor TransformerBlock::final_norm_forward(const LayerContext& ctx, const Tensor& x) {
  MG_CHECK(final_layernorm_ != nullptr, "TransformerBlock: no final norm in this chunk");
  hooks_.before_forward(*final_layernorm_);
  Tensor y = final_layernorm_->forward(ctx, x);
  hooks_.after_forward(*final_layernorm_);
  return y;
}

Tensor TransformerBlock::final_norm_backward(const LayerContext& ctx, const Tensor& dxf) {
  return final_layernorm_->backward(ctx, dxf);
}

}  // namespace megatron::model
