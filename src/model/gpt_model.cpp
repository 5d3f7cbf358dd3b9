// GPTModel: the decoder-only family's layer specs and loss head (see gpt_model.h).
#include "model/gpt_model.h"

#include "kernels/ops.h"
#include "model/inference_context.h"
#include "model/layer_spec.h"
#include "model/model_family.h"

namespace megatron::model {

namespace {

std::shared_ptr<Communicator> checked(std::shared_ptr<Communicator> g, const char* what) {
  MG_CHECK(g != nullptr, "GPTModel: null ", what, " group");
  return g;
}

// The configuration's checks, before any layer is built, then every layer's spec.
std::vector<TransformerLayerSpec> validated_specs(const TransformerConfig& cfg,
                                                  const TensorParallel& tp,
                                                  const ContextParallel& cp) {
  cfg.validate();
  MG_REQUIRE(cfg.family_id() == ModelFamilyId::gpt, "this is a ", cfg.model_family, " model (",
             model_family_of(cfg).command, " trains it), not a GPT: text generation and "
             "language-model evaluation need a GPT (decoder-only) model");
  cfg.validate_tensor_parallel(tp.size());
  cfg.validate_context_parallel(cp.size());
  std::vector<TransformerLayerSpec> specs;
  for (int l = 0; l < cfg.num_layers; ++l) specs.push_back(gpt_layer_spec(cfg, l));
  return specs;
}

}  // namespace

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed)
    : GPTModel(cfg, seed, TensorParallel::none().group) {}

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed,
                   std::shared_ptr<Communicator> tp_group)
    : GPTModel(cfg, seed, std::move(tp_group), ContextParallel::none().group) {}

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed,
                   std::shared_ptr<Communicator> tp_group, std::shared_ptr<Communicator> cp_group)
    : GPTModel(cfg, seed,
               TensorParallel::make(checked(std::move(tp_group), "tensor-parallel"),
                                    cfg.sequence_parallel),
               ContextParallel{checked(std::move(cp_group), "context-parallel"),
                               parse_cp_comm_type(cfg.cp_comm_type)},
               ChunkPlace{PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0}) {}

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                   const ContextParallel& cp, const ChunkPlace& place, const ModelOptions& options)
    : LanguageModule(cfg, seed, tp, cp, place, options, "decoder",
                     validated_specs(cfg, tp, cp), /*num_tokentypes=*/0) {
  if (post_process_) make_output_layer(/*bias=*/false);
  finish(options);
}

const std::vector<std::string>& GPTModel::loss_names() const {
  static const std::vector<std::string> names = {"lm loss"};
  return names;
}

std::vector<Module*> GPTModel::head_modules() { return {output_layer_.get()}; }

LossResult GPTModel::head_loss(const LayerContext&, const Tensor& xf, const Batch& in,
                               float grad_scale, Tensor* dxf) {
  output_before_forward();
  LossResult res = masked_lm_loss(*output_layer_, xf, in, grad_scale, dxf);
  output_after_forward();
  return res;
}

Tensor GPTModel::head_logits(const LayerContext&, const Tensor& xf) {
  output_before_forward();
  Tensor logits = output_layer_->logits(xf);
  output_after_forward();
  return logits;
}

void GPTModel::allocate_inference(InferenceContext& ic, int64_t slots, int64_t max_len) const {
  MG_REQUIRE(max_len >= 1 && max_len <= cfg_.max_position_embeddings, "sequence length ",
             max_len, " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  ic.allocate(cfg_.num_layers, slots, cfg_.query_groups() / tp_.size(), max_len, cfg_.head_dim(),
              device_, block_->first_layer(), cache_dtype_for(cfg_.params_dtype, device_));
}

Tensor GPTModel::forward_inference(const Tensor& tokens, InferenceContext& ic,
                                   const Tensor& logit_rows, const Tensor& hidden) {
  MG_CHECK(cp_.size() == 1 && !tp_.sequence_parallel,
           "GPTModel::forward_inference runs without context or sequence parallelism");
  const int64_t n = tokens.numel();
  MG_CHECK(tokens.dtype() == DType::I32 && ic.row_slot.numel() == n && ic.row_pos.numel() == n,
           "forward_inference: ", n, " tokens need as many slots and positions");
  MG_CHECK(pre_process() || (hidden.defined() && hidden.size(0) == n),
           "forward_inference: a stage without the embedding needs the previous stage's output");
  LayerContext ctx;
  ctx.batch = 1;
  ctx.seq = n;
  ctx.seed = seed_;
  ctx.inference = &ic;
  if (cfg_.rope()) ctx.rope_positions = ic.row_pos;
  Tensor x;
  if (pre_process()) {
    Batch in;
    in.tokens = tokens.view({1, n});
    in.position_ids = ic.row_pos.view({1, n});
    x = block_->forward(ctx, embed(ctx, in), nullptr);
  } else {
    x = block_->forward(ctx, hidden, nullptr);
  }
  if (!post_process()) return x;
  Tensor picked = Tensor::empty({logit_rows.numel(), x.size(1)}, DType::F32, x.device());
  ops::index_select_rows(picked, x, logit_rows);
  return head_logits(ctx, block_->final_norm_forward(ctx, picked));
}

}  // namespace megatron::model
