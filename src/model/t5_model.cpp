// T5Model: the encoder-decoder family's layer specs, its two blocks and its LM head (see
// t5_model.h).
#include "model/t5_model.h"

#include <algorithm>
#include <utility>

#include "kernels/ops.h"
#include "model/layer_spec.h"
#include "model/weight_spec.h"

namespace megatron::model {

TransformerLayerSpec t5_encoder_layer_spec(const TransformerConfig& cfg) {
  TransformerLayerSpec s = gpt_layer_spec(cfg);
  s.self_attention.causal = false;  // AttnMaskType.arbitrary with the encoder's padding mask
  s.self_attention.relative_bias = cfg.relative_position_bias();
  return s;
}

TransformerLayerSpec t5_decoder_layer_spec(const TransformerConfig& cfg) {
  TransformerLayerSpec s = gpt_layer_spec(cfg);
  s.self_attention.causal = true;
  s.self_attention.relative_bias = cfg.relative_position_bias();
  s.pre_cross_attn_layernorm = s.input_layernorm;
  return s;
}

void T5Model::validate(const TransformerConfig& cfg) {
  MG_REQUIRE(cfg.learned_position_embedding() || cfg.relative_position_bias() || cfg.rope(),
             "--position-embedding-type ", cfg.position_embedding_type,
             ": T5 supports learned_absolute, relative or rope (Megatron-Core's T5Model)");
  MG_REQUIRE(cfg.window_left < 0 && cfg.window_right < 0,
             "--window-size (sliding-window attention) is not supported for T5");
  MG_REQUIRE(!cfg.qk_layernorm, "--qk-layernorm is not supported for T5 (t5_spec.py's attention "
             "has no query/key norm)");
  MG_REQUIRE(cfg.query_groups() == cfg.num_attention_heads,
             "--num-query-groups ", cfg.query_groups(), ": T5's cross-attention has no "
             "grouped-query form (Megatron-Core's CrossAttention), so T5 needs multi-head "
             "attention (drop --group-query-attention)");
  MG_REQUIRE(cfg.decoder_num_layers >= 0, "--decoder-num-layers must be > 0 (got ",
             cfg.decoder_num_layers, ")");
  MG_REQUIRE(cfg.decoder_seq_length >= 0, "--decoder-seq-length must be > 0 (got ",
             cfg.decoder_seq_length, ")");
  MG_REQUIRE(!cfg.learned_position_embedding() ||
                 cfg.max_position_embeddings >= cfg.decoder_seq_length,
             "--max-position-embeddings (", cfg.max_position_embeddings,
             ") must be >= --decoder-seq-length (", cfg.decoder_seq_length, ")");
  if (cfg.relative_position_bias()) {
    MG_REQUIRE(cfg.relative_attention_num_buckets >= 4,
               "--relative-attention-num-buckets must be >= 4 (got ",
               cfg.relative_attention_num_buckets, ")");
    MG_REQUIRE(cfg.relative_attention_max_distance > cfg.relative_attention_num_buckets / 2,
               "--relative-attention-max-distance ", cfg.relative_attention_max_distance,
               " must exceed half of --relative-attention-num-buckets (",
               cfg.relative_attention_num_buckets, "): the causal buckets are exact up to there");
  }
}

namespace {

std::vector<TransformerLayerSpec> encoder_specs(const TransformerConfig& cfg,
                                                const TensorParallel& tp,
                                                const ContextParallel& cp,
                                                const ChunkPlace& place) {
  cfg.validate();
  MG_REQUIRE(cfg.family_id() == ModelFamilyId::t5, "T5Model needs a T5 configuration (model family '",
             cfg.model_family, "')");
  cfg.validate_tensor_parallel(tp.size());
  MG_REQUIRE(place.layout.pipeline_size == 1 && place.layout.num_chunks == 1,
             "--pipeline-model-parallel-size ", place.layout.pipeline_size,
             ": T5 trains without pipeline parallelism, as in Megatron-LM (pretrain_t5.py: "
             "\"Pipeline parallelism is not supported for T5.\"); use "
             "--pipeline-model-parallel-size 1 and split the model with "
             "--tensor-model-parallel-size (with --sequence-parallel) and data parallelism "
             "(--use-distributed-optimizer)");
  MG_REQUIRE(cp.size() == 1, "--context-parallel-size ", cp.size(),
             ": T5 trains without context parallelism, as in Megatron-LM (pretrain_t5.py's "
             "get_batch gives every rank whole samples, and Megatron-Core's local attention "
             "asserts \"Context parallelism is only supported by TEDotProductAttention!\"); use "
             "--context-parallel-size 1 and --tensor-model-parallel-size with "
             "--sequence-parallel for long samples");
  MG_REQUIRE(!tp.sequence_parallel || cfg.decoder_seq_length % tp.size() == 0,
             "--decoder-seq-length ", cfg.decoder_seq_length,
             " is not divisible by --tensor-model-parallel-size ", tp.size(),
             " (required by --sequence-parallel: each rank holds 1/", tp.size(),
             " of the decoder's tokens)");
  return std::vector<TransformerLayerSpec>(size_t(cfg.num_layers), t5_encoder_layer_spec(cfg));
}

// Position ids 0..s-1 of every sequence (t5_position_ids).
Tensor position_ids(int64_t b, int64_t s, Device device) {
  std::vector<int32_t> pos(size_t(b * s));
  for (int64_t i = 0; i < b * s; ++i) pos[size_t(i)] = int32_t(i % s);
  return Tensor::from_vector(pos, {b, s}, device);
}

}  // namespace

struct T5Model::Pass {
  LayerContext enc, dec;
  ActivationStash embedding_enc, embedding_dec, encoder_final;
  BlockStash encoder_block, decoder_block;
  Tensor dout;  // gradient of the decoder block's output
};

T5Model::T5Model(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                 const ContextParallel& cp)
    : T5Model(cfg, seed, tp, cp,
              ChunkPlace{PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0}) {}

T5Model::T5Model(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                 const ContextParallel& cp, const ChunkPlace& place, const ModelOptions& options)
    : LanguageModule(cfg, seed, tp, cp, place, options, "encoder",
                     encoder_specs(cfg, tp, cp, place), 0) {
  if (cfg.relative_position_bias()) {
    encoder_relative_ = std::make_unique<RelativePositionEmbedding>(
        "encoder_relative_pos_emb", true, cfg.num_attention_heads,
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
        cfg.params_dtype, tp, options.grad);
    decoder_relative_ = std::make_unique<RelativePositionEmbedding>(
        "decoder_relative_pos_emb", false, cfg.num_attention_heads,
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
        cfg.params_dtype, tp, options.grad);
  }
  decoder_ = std::make_unique<TransformerBlock>(
      "decoder", cfg,
      std::vector<TransformerLayerSpec>(size_t(cfg.decoder_layers()), t5_decoder_layer_spec(cfg)),
      0, true, tp, cp, options.grad, hooks_);
  // T5LMHead: a bias exactly when the output layer is tied to the word table.
  make_output_layer(/*bias=*/!cfg.untie_embeddings_and_output_weights);
  finish(options);
}

T5Model::~T5Model() = default;

const std::vector<std::string>& T5Model::loss_names() const {
  static const std::vector<std::string> names = {"lm loss"};
  return names;
}

ParameterList T5Model::parameters() {
  ParameterList out;
  for (Module* m : modules()) m->parameters(out);
  return out;
}

std::vector<Module*> T5Model::modules() {
  std::vector<Module*> m = {embedding_.get()};
  if (encoder_relative_) {
    m.push_back(encoder_relative_.get());
    m.push_back(decoder_relative_.get());
  }
  m.push_back(block_.get());
  m.push_back(decoder_.get());
  m.push_back(output_layer_.get());
  return m;
}

std::vector<Module*> T5Model::head_modules() { return {output_layer_.get()}; }

// Each parameter from the stream 1000 + its position in parameters(); the output projections'
// scaled init uses the depth of their own block (Megatron-Core's encoder_config and config).
void T5Model::init_weights() {
  const InitScale enc = InitScale::of(cfg_.init_method_std, cfg_.num_layers);
  const InitScale dec = InitScale::of(cfg_.init_method_std, cfg_.decoder_layers());
  size_t index = 0;
  for (Module* m : modules()) {
    const InitScale& scale = m == decoder_.get() || m == output_layer_.get() ? dec : enc;
    for (Parameter* p : m->parameters()) init_parameter(*p, seed_, 1000 + index++, scale, tp_);
  }
}

Tensor T5Model::run_forward(Pass& p, const Batch& in) {
  const bool save = p.enc.save;
  MG_REQUIRE(in.encoder_tokens.defined() && in.encoder_tokens.dim() == 2 &&
                 in.encoder_tokens.dtype() == DType::I32,
             "T5 needs the encoder's tokens (text_enc) as an int32 [batch, encoder seq] tensor");
  MG_REQUIRE(in.tokens.defined() && in.tokens.dim() == 2 &&
                 in.tokens.size(0) == in.encoder_tokens.size(0),
             "T5's decoder tokens (text_dec) must be [batch, decoder seq] with the encoder's "
             "batch ",
             in.encoder_tokens.size(0));
  const int64_t b = in.tokens.size(0), se = in.encoder_tokens.size(1), sd = in.tokens.size(1);
  // ---- encoder
  Batch eb;
  eb.tokens = in.encoder_tokens;
  eb.position_ids = position_ids(b, se, device_);
  LayerContext& ectx = p.enc;
  ectx = make_ctx(eb, p.enc.training, save, p.enc.dropout_offset);
  if (in.encoder_padding_mask.defined()) {
    MG_REQUIRE(in.encoder_padding_mask.dtype() == DType::I32 &&
                   in.encoder_padding_mask.shape() == eb.tokens.shape(),
               "the encoder's padding mask (enc_mask) must be int32 with text_enc's shape ",
               shape_str(eb.tokens.shape()));
    ectx.key_padding = in.encoder_padding_mask.contiguous();
  }
  auto relative_bias = [&](RelativePositionEmbedding& rel, LayerContext& ctx, int64_t s) {
    hooks_.before_forward(rel);
    ctx.attention_bias = rel.forward(s, s, device_);
    if (save)
      ctx.attention_bias_grad = Tensor::zeros(ctx.attention_bias.shape(), DType::F32, device_);
    else
      hooks_.after_forward(rel);
  };
  if (encoder_relative_) relative_bias(*encoder_relative_, ectx, se);
  Tensor x = embed(ectx, eb);
  if (save) p.embedding_enc = embedding_->take_saved();
  x = block_->forward(ectx, x, save ? &p.encoder_block : nullptr);
  const Tensor encoded = block_->final_norm_forward(ectx, x);
  if (save) p.encoder_final = block_->final_layernorm().take_saved();
  // ---- decoder, its cross-attention over `encoded`
  Batch db;
  db.tokens = in.tokens;
  db.position_ids = position_ids(b, sd, device_);
  LayerContext& dctx = p.dec;
  dctx = make_ctx(db, ectx.training, save, ectx.dropout_offset);
  dctx.layer_offset = cfg_.num_layers;  // the decoder's dropout streams follow the encoder's
  dctx.context = encoded;
  dctx.context_seq = se;
  dctx.context_padding = ectx.key_padding;
  if (save) dctx.context_grad = Tensor::zeros(encoded.shape(), DType::F32, device_);
  if (decoder_relative_) relative_bias(*decoder_relative_, dctx, sd);
  Tensor y = embed(dctx, db);
  if (save) p.embedding_dec = embedding_->take_saved();
  y = decoder_->forward(dctx, y, save ? &p.decoder_block : nullptr);
  return decoder_->final_norm_forward(dctx, y);
}

Tensor T5Model::forward(int64_t mb, const Batch& in, const Tensor&, const ChunkForward& opt,
                        LossResult* loss) {
  MG_CHECK(loss != nullptr, "T5Model::forward needs a LossResult (the model is one chunk)");
  MG_CHECK(!in_flight_.count(mb), "model chunk forward: micro-batch ", mb, " is already in flight");
  auto p = std::make_unique<Pass>();
  p->enc.training = p->enc.save = opt.training;
  p->enc.dropout_offset = opt.dropout_offset;
  const Tensor xf = run_forward(*p, in);
  Tensor dxf;
  *loss = head_loss(p->dec, xf, in, opt.grad_scale, opt.training ? &dxf : nullptr);
  if (opt.training) {
    p->dout = decoder_->final_norm_backward(p->dec, dxf);
    in_flight_.emplace(mb, std::move(p));
  }
  return Tensor();
}

Tensor T5Model::backward(int64_t mb, const Tensor&) {
  auto it = in_flight_.find(mb);
  MG_CHECK(it != in_flight_.end(), "model chunk backward: micro-batch ", mb,
           " is not in flight (no training forward, or already backwarded)");
  std::unique_ptr<Pass> p = std::move(it->second);
  in_flight_.erase(it);
  // The head and the decoder's final norm were differentiated by the forward.
  hooks_.after_backward(decoder_->final_layernorm());
  hooks_.after_backward(*output_layer_);
  backward_pass(*p, std::exchange(p->dout, Tensor()));
  return Tensor();
}

void T5Model::backward_pass(Pass& p, const Tensor& dout) {
  Tensor dx = decoder_->backward(p.dec, dout, p.decoder_block);
  embedding_->restore_saved(std::move(p.embedding_dec));
  embedding_->backward(p.dec, dx);
  if (decoder_relative_) {
    decoder_relative_->backward(p.dec.attention_bias_grad);
    hooks_.after_backward(*decoder_relative_);
  }
  // The encoder's output reached every decoder layer's cross-attention: their gradients summed.
  block_->final_layernorm().restore_saved(std::move(p.encoder_final));
  dx = block_->final_norm_backward(p.enc, p.dec.context_grad);
  hooks_.after_backward(block_->final_layernorm());
  dx = block_->backward(p.enc, dx, p.encoder_block);
  if (encoder_relative_) {
    encoder_relative_->backward(p.enc.attention_bias_grad);
    hooks_.after_backward(*encoder_relative_);
  }
  embedding_->restore_saved(std::move(p.embedding_enc));
  embedding_->backward(p.enc, dx);
  hooks_.after_backward(*embedding_);
}

// Megatron's T5 labels are -1 where the decoder is padding (outside the loss mask): those become
// 0, a valid id whose loss the mask drops.
LossResult T5Model::head_loss(const LayerContext&, const Tensor& xf, const Batch& in,
                              float grad_scale, Tensor* dxf) {
  check_lm_targets(in);
  const Tensor labels = in.labels.contiguous().to(Device::cpu());
  const Tensor mask = in.loss_mask.contiguous().to(Device::cpu());
  std::vector<int32_t> fixed(size_t(labels.numel()));
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const int32_t l = labels.data<int32_t>()[i];
    MG_REQUIRE(l >= 0 || mask.data<float>()[i] == 0.0f, "label ", l, " of decoder token ", i,
               " is inside the loss mask (only padding, outside it, may be -1)");
    fixed[size_t(i)] = std::max(l, 0);
  }
  Batch targets = in;
  targets.labels = Tensor::from_vector(fixed, in.labels.shape(), device_);
  output_before_forward();
  LossResult res = masked_lm_loss(*output_layer_, xf, targets, grad_scale, dxf);
  output_after_forward();
  return res;
}

Tensor T5Model::head_logits(const LayerContext&, const Tensor& xf) {
  output_before_forward();
  Tensor logits = output_layer_->logits(xf);
  output_after_forward();
  return logits;
}

Tensor T5Model::forward_logits(const Batch& in) {
  Pass p;
  const Tensor xf = run_forward(p, in);
  return head_logits(p.dec, xf).view({p.dec.batch, p.dec.seq, cfg_.padded_vocab_size});
}

}  // namespace megatron::model
