// BertModel: the encoder family's layer spec and its masked-LM and sentence-order heads (see
// bert_model.h).
#include "model/bert_model.h"

#include <algorithm>

#include "comm/tp_mappings.h"
#include "kernels/ops.h"
#include "model/layer_spec.h"
#include "model/norm.h"

namespace megatron::model {

TransformerLayerSpec bert_layer_spec(const TransformerConfig& cfg) {
  TransformerLayerSpec s = gpt_layer_spec(cfg);
  s.self_attention.causal = false;
  return s;
}

void BertModel::validate(const TransformerConfig& cfg) {
  MG_REQUIRE(!cfg.causal(), "BERT attends in both directions: its configuration needs the "
             "bidirectional attention mask (pretrain-bert sets it)");
  MG_REQUIRE(cfg.normalization == "LayerNorm", "--normalization ", cfg.normalization,
             ": BERT's masked-LM head uses LayerNorm (Megatron-Core's FusedLayerNorm), so the "
             "model needs --normalization LayerNorm");
  MG_REQUIRE(cfg.learned_position_embedding() || cfg.rope(), "--position-embedding-type ",
             cfg.position_embedding_type, ": BERT supports learned_absolute or rope");
  MG_REQUIRE(cfg.window_left < 0 && cfg.window_right < 0,
             "--window-size (sliding-window attention) is not supported for BERT");
}

namespace {

std::vector<TransformerLayerSpec> validated_specs(const TransformerConfig& cfg,
                                                  const TensorParallel& tp,
                                                  const ContextParallel& cp) {
  cfg.validate();
  MG_REQUIRE(cfg.family_id() == ModelFamilyId::bert, "BertModel needs a BERT configuration (model family '",
             cfg.model_family, "')");
  cfg.validate_tensor_parallel(tp.size());
  cfg.validate_context_parallel(cp.size());
  MG_REQUIRE(cp.size() == 1, "--context-parallel-size ", cp.size(), ": BERT is not implemented "
             "with context parallelism (its pooler reads each sequence's first token, which one "
             "context-parallel rank holds); use --context-parallel-size 1");
  return std::vector<TransformerLayerSpec>(size_t(cfg.num_layers), bert_layer_spec(cfg));
}

NormOptions head_norm_options(const TransformerConfig& cfg, const TensorParallel& tp, bool grad) {
  NormOptions o;
  o.eps = cfg.layernorm_epsilon;
  o.zero_centered_gamma = cfg.apply_layernorm_1p;
  o.partial_grad = tp.sequence_parallel;
  o.grad = grad;
  return o;
}

}  // namespace

struct BertModel::Heads {
  Heads(const TransformerConfig& cfg, const TensorParallel& tp, bool grad)
      : lm_dense("lm_head.dense", cfg.hidden_size, cfg.hidden_size, cfg.params_dtype,
                 tp.sequence_parallel, grad),
        lm_norm("lm_head.layer_norm", cfg.hidden_size, norm_kind("LayerNorm"), cfg.params_dtype,
                head_norm_options(cfg, tp, grad)) {
    if (cfg.bert_binary_head) {
      binary_head = std::make_unique<Linear>("binary_head", cfg.hidden_size, 2, cfg.params_dtype,
                                             false, grad);
      pooler = std::make_unique<Linear>("pooler.dense", cfg.hidden_size, cfg.hidden_size,
                                        cfg.params_dtype, false, grad);
    }
  }
  Linear lm_dense;
  Norm lm_norm;
  std::unique_ptr<Linear> binary_head, pooler;
};

BertModel::BertModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                     const ContextParallel& cp)
    : BertModel(cfg, seed, tp, cp, ChunkPlace{PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0}) {}

BertModel::BertModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                     const ContextParallel& cp, const ChunkPlace& place,
                     const ModelOptions& options)
    : LanguageModule(cfg, seed, tp, cp, place, options, "encoder", validated_specs(cfg, tp, cp),
                     cfg.bert_binary_head ? 2 : 0) {
  if (post_process_) {
    heads_ = std::make_unique<Heads>(cfg, tp, options.grad);
    make_output_layer(/*bias=*/true);
  }
  finish(options);
}

BertModel::~BertModel() = default;

const std::vector<std::string>& BertModel::loss_names() const {
  static const std::vector<std::string> with_sop = {"lm loss", "sop loss"}, lm = {"lm loss"};
  return cfg_.bert_binary_head ? with_sop : lm;
}

std::vector<Module*> BertModel::head_modules() {
  std::vector<Module*> m = {&heads_->lm_dense, &heads_->lm_norm, output_layer_.get()};
  if (heads_->binary_head) {
    m.push_back(heads_->binary_head.get());
    m.push_back(heads_->pooler.get());
  }
  return m;
}

namespace {

// lm_head: dense, exact GeLU, LayerNorm. `a` receives the GeLU's input (for backward).
Tensor lm_head_forward(const LayerContext& ctx, Linear& dense, Norm& norm, const ModuleHooks& hk,
                       const Tensor& xf, Tensor& pre_gelu) {
  hk.before_forward(dense);
  pre_gelu = dense.forward(ctx, xf);
  hk.after_forward(dense);
  Tensor g = Tensor::empty(pre_gelu.shape(), DType::F32, pre_gelu.device());
  ops::activation_fwd(ActivationId::gelu, g, pre_gelu);
  hk.before_forward(norm);
  Tensor y = norm.forward(ctx, g);
  hk.after_forward(norm);
  return y;
}

}  // namespace

LossResult BertModel::head_loss(const LayerContext& ctx, const Tensor& xf, const Batch& in,
                                float grad_scale, Tensor* dxf) {
  check_lm_targets(in);
  // Masked LM: the mean over the masked tokens.
  const double tokens = ops::sum(in.loss_mask.contiguous());
  const float lm_scale = float(double(grad_scale) / std::max(tokens, 1.0));
  Tensor pre_gelu;
  Tensor h = lm_head_forward(ctx, heads_->lm_dense, heads_->lm_norm, hooks(), xf, pre_gelu);
  Tensor dh;
  output_before_forward();
  LossResult lm = masked_lm_loss(*output_layer_, h, in, lm_scale, dxf ? &dh : nullptr);
  output_after_forward();
  LossResult res;
  res.loss_sum = lm.loss_sum / std::max(lm.num_tokens, 1.0);
  res.num_tokens = 1;
  if (dxf) {
    Tensor dg = heads_->lm_norm.backward(ctx, dh);
    Tensor dpre = Tensor::empty(pre_gelu.shape(), DType::F32, pre_gelu.device());
    ops::activation_bwd(ActivationId::gelu, dpre, dg, pre_gelu);
    *dxf = heads_->lm_dense.backward(ctx, dpre);
  }
  if (heads_->binary_head) {
    LossTerm sop;
    binary_logits(ctx, xf, in.sequence_labels, grad_scale, dxf, &sop);
    res.more.push_back({sop.sum / std::max(sop.count, 1.0), 1.0});
  }
  return res;
}

Tensor BertModel::binary_logits(const LayerContext& ctx, const Tensor& xf, const Tensor& labels,
                                float grad_scale, Tensor* dxf, LossTerm* loss) {
  const int64_t b = ctx.batch, s = ctx.seq, h = cfg_.hidden_size;
  const int64_t R = xf.size(0), row0 = tp_.sequence_parallel ? int64_t(tp_.rank()) * R : 0;
  // Each sequence's first token ([CLS]) among this rank's rows; under sequence parallelism the
  // ranks' rows are summed, so every rank pools every sequence (Megatron's pooler gathers the
  // sequence, then runs on every rank alike).
  std::vector<int32_t> src, dst;
  for (int64_t bi = 0; bi < b; ++bi)
    if (bi * s >= row0 && bi * s < row0 + R) {
      src.push_back(int32_t(bi * s - row0));
      dst.push_back(int32_t(bi));
    }
  const Device dev = xf.device();
  const Tensor src_t = Tensor::from_vector(src, {int64_t(src.size())}, dev);
  const Tensor dst_t = Tensor::from_vector(dst, {int64_t(dst.size())}, dev);
  Tensor cls = Tensor::zeros({b, h}, DType::F32, dev);
  if (!src.empty()) {
    Tensor picked = Tensor::empty({int64_t(src.size()), h}, DType::F32, dev);
    ops::index_select_rows(picked, xf, src_t);
    ops::index_copy_rows(cls, picked, dst_t);
  }
  if (tp_.sequence_parallel) cls = tp::ReduceFromTensorParallelRegion::forward(tp_.comm(), cls);
  Linear& pooler = *heads_->pooler;
  Linear& head = *heads_->binary_head;
  hooks().before_forward(pooler);
  Tensor pooled = pooler.forward(ctx, cls);
  hooks().after_forward(pooler);
  ops::tanh_fwd(pooled, pooled);
  hooks().before_forward(head);
  Tensor z = head.forward(ctx, pooled);
  hooks().after_forward(head);
  if (loss == nullptr) return z;

  // Cross entropy over the two classes, ignoring label -1 (F.cross_entropy's ignore_index).
  MG_REQUIRE(labels.defined() && labels.dtype() == DType::I32 && labels.numel() == b,
             "BERT's binary head needs the sentence-order labels (is_random): int32 [", b, "]");
  const Tensor host = labels.contiguous().to(Device::cpu());
  std::vector<int32_t> target(static_cast<size_t>(b));
  std::vector<float> mask(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    const int32_t l = host.data<int32_t>()[i];
    MG_REQUIRE(l == -1 || l == 0 || l == 1, "sentence-order label ", l, " of sequence ", i,
               " is not 0, 1 or -1 (ignored)");
    target[size_t(i)] = l < 0 ? 0 : l;
    mask[size_t(i)] = l < 0 ? 0.0f : 1.0f;
  }
  const Tensor target_t = Tensor::from_vector(target, {b}, dev);
  const Tensor mask_t = Tensor::from_vector(mask, {b}, dev);
  const double count = ops::sum(mask_t);
  Tensor per_seq = Tensor::empty({b}, DType::F32, dev);
  const float scale = float(double(grad_scale) / std::max(count, 1.0));
  ops::softmax_xent_fwd_bwd(z, per_seq, target_t, mask_t, scale, dxf != nullptr);
  loss->sum = ops::dot(per_seq, mask_t);
  loss->count = count;
  if (dxf) {  // z now holds dloss/dlogits
    Tensor dpooled = head.backward(ctx, z);
    ops::tanh_bwd(dpooled, dpooled, pooled);
    Tensor dcls = pooler.backward(ctx, dpooled);  // identity through the sum over TP ranks
    if (!src.empty()) {
      Tensor rows = Tensor::empty({int64_t(src.size()), h}, DType::F32, dev);
      ops::index_select_rows(rows, dcls, dst_t);
      ops::index_copy_rows(*dxf, rows, src_t, /*accumulate=*/true);
    }
  }
  return z;
}

Tensor BertModel::head_logits(const LayerContext& ctx, const Tensor& xf) {
  Tensor pre_gelu;
  Tensor h = lm_head_forward(ctx, heads_->lm_dense, heads_->lm_norm, hooks(), xf, pre_gelu);
  output_before_forward();
  Tensor logits = output_layer_->logits(h);
  output_after_forward();
  return logits;
}

Tensor BertModel::forward_binary_logits(const Batch& in) {
  MG_CHECK(pre_process() && post_process(), "forward_binary_logits needs the whole model");
  MG_REQUIRE(heads_->binary_head != nullptr, "this BERT model has no binary head "
             "(--bert-no-binary-head)");
  const LayerContext ctx = make_ctx(in, false, false, 0);
  Tensor x = block_->forward(ctx, embed(ctx, in), nullptr);
  return binary_logits(ctx, block_->final_norm_forward(ctx, x), Tensor(), 1.0f, nullptr, nullptr);
}

}  // namespace megatron::model
