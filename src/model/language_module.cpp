// The shared part of the language-model families: embedding, block, micro-batches in flight,
// hooks, initial weights (see language_module.h).
#include "model/language_module.h"

#include <algorithm>
#include <utility>

#include "kernels/ops.h"
#include "model/weight_spec.h"

namespace megatron::model {

LossResult& LossResult::operator+=(const LossResult& o) {
  loss_sum += o.loss_sum;
  num_tokens += o.num_tokens;
  if (more.size() < o.more.size()) more.resize(o.more.size());
  for (size_t i = 0; i < o.more.size(); ++i) {
    more[i].sum += o.more[i].sum;
    more[i].count += o.more[i].count;
  }
  return *this;
}

void check_lm_targets(const Batch& in) {
  MG_REQUIRE(in.labels.defined() && in.labels.dtype() == DType::I32 &&
                 in.labels.shape() == in.tokens.shape(),
             "labels must be int32 with the tokens' shape ", shape_str(in.tokens.shape()));
  MG_REQUIRE(in.loss_mask.defined() && in.loss_mask.dtype() == DType::F32 &&
                 in.loss_mask.shape() == in.tokens.shape(),
             "loss_mask must be float32 with the tokens' shape ", shape_str(in.tokens.shape()));
}

LossResult masked_lm_loss(OutputLayer& output, const Tensor& xf, const Batch& in,
                          float grad_scale, Tensor* dxf) {
  check_lm_targets(in);
  const int64_t N = in.tokens.numel();
  const Tensor mask = in.loss_mask.contiguous().view({N});
  Tensor loss = output.loss(xf, in.labels.contiguous().view({N}), mask, grad_scale, dxf);
  LossResult res;
  res.loss_sum = ops::dot(loss, mask);
  res.num_tokens = ops::sum(mask);
  return res;
}

LanguageModule::LanguageModule(const TransformerConfig& cfg, uint64_t seed,
                               const TensorParallel& tp, const ContextParallel& cp,
                               const ChunkPlace& place, const ModelOptions& options,
                               const std::string& block_name,
                               const std::vector<TransformerLayerSpec>& specs, int num_tokentypes)
    : cfg_(cfg), seed_(seed), tp_(tp), cp_(cp), device_(options.device),
      num_tokentypes_(num_tokentypes), all_specs_(specs) {
  hooks_.transient_working_weights = !options.grad;
  const PipelineLayout& L = place.layout;
  MG_REQUIRE(cfg.num_layers == L.num_layers, "--num-layers ", cfg.num_layers,
             " does not match the pipeline layout's ", L.num_layers);
  L.validate();
  MG_CHECK(place.pp_rank >= 0 && place.pp_rank < L.pipeline_size && place.chunk >= 0 &&
               place.chunk < L.num_chunks,
           "model chunk ", place.chunk, " of pipeline rank ", place.pp_rank, " outside the layout");
  MG_CHECK(int(specs.size()) == cfg.num_layers, "LanguageModule: ", specs.size(),
           " layer specs for ", cfg.num_layers, " layers");
  const int first = L.first_layer(place.pp_rank, place.chunk);
  post_process_ = L.has_output(place.pp_rank, place.chunk);
  if (L.has_embedding(place.pp_rank, place.chunk))
    embedding_ = std::make_unique<Embedding>(
        cfg.padded_vocab_size, cfg.learned_position_embedding() ? cfg.max_position_embeddings : 0,
        cfg.hidden_size, cfg.hidden_dropout, cfg.params_dtype, tp, options.grad, num_tokentypes);
  std::vector<TransformerLayerSpec> mine(specs.begin() + first,
                                         specs.begin() + first + L.layers_per_chunk());
  block_ = std::make_unique<TransformerBlock>(block_name, cfg, std::move(mine), first,
                                              post_process_, tp, cp, options.grad, hooks_);
}

LanguageModule::~LanguageModule() = default;

void LanguageModule::finish(const ModelOptions& options) {
  if (options.init_weights) init_weights();
  move_to_device();
}

ParameterList LanguageModule::parameters() {
  ParameterList out;
  if (embedding_) embedding_->parameters(out);
  block_->parameters(out);
  if (post_process_)
    for (Module* m : head_modules()) m->parameters(out);
  return out;
}

namespace {
// The weights of one expert in `ps` (0 when it holds none).
int weights_per_expert(const ParameterList& ps) {
  int first = -1, n = 0;
  for (const Parameter* p : ps) {
    if (p->expert < 0) continue;
    if (first < 0) first = p->expert;
    if (p->expert == first) ++n;
  }
  return n;
}
}  // namespace

// Each parameter is drawn from the stream 1000 + its position in the single-rank parameters():
// the embedding's, then every layer's, then the final norm's, then the head's. A shared copy of
// the tied word table (the last stage's output_layer.weight) is not in the single-rank list and
// draws the word table's stream (position 0).
void LanguageModule::init_weights() {
  const InitScale scale = InitScale::of(cfg_.init_method_std, cfg_.num_layers);
  size_t index = 0;
  auto init = [&](const ParameterList& ps) {
    // Under expert parallelism a layer holds only this rank's experts (consecutive, k weights
    // each): the streams of the other ranks' experts are skipped, so every weight draws the
    // stream it has in the single-rank model.
    const int per_expert = weights_per_expert(ps);
    int next_expert = 0;
    auto skip_to = [&](int expert) {
      index += size_t(std::max(0, expert - next_expert) * per_expert);
      next_expert = std::max(next_expert, expert);
    };
    for (Parameter* p : ps) {
      if (p->expert >= 0 && p->expert >= next_expert) {
        skip_to(p->expert);
        next_expert = p->expert + 1;
      } else if (p->expert < 0 && next_expert > 0) {
        skip_to(cfg_.num_moe_experts);
      }
      if (p->shared)
        init_parameter(*p, seed_, 1000, scale, tp_);
      else  // an expert's weight: sharded by the experts' tensor parallelism
        init_parameter(*p, seed_, 1000 + index++, scale, p->expert >= 0 ? tp_.experts() : tp_);
    }
    if (next_expert > 0) skip_to(cfg_.num_moe_experts);
  };
  if (embedding_)
    init(embedding_->parameters());
  else  // the first chunk's: word table, position table, token-type table
    index += 1 + (cfg_.learned_position_embedding() ? 1 : 0) + (num_tokentypes_ > 0 ? 1 : 0);
  for (int l = 0; l < block_->first_layer(); ++l)
    index += TransformerLayer::count_parameters(cfg_, all_specs_[size_t(l)]);
  for (int l = 0; l < block_->num_layers(); ++l) init(block_->layer(l).parameters());
  if (post_process_) {
    init(block_->final_layernorm().parameters());
    for (Module* m : head_modules()) init(m->parameters());
  }
}

// Parameters and gradients (drawn or zeroed on the host) to the model's device, then the working
// weights there (none of half-precision weights in a model without gradients).
void LanguageModule::move_to_device() {
  for (Parameter* p : parameters()) {
    if (p->value.device() != device_) p->value = p->value.to(device_);
    if (p->grad.defined() && p->grad.device() != device_) p->grad = p->grad.to(device_);
  }
  for (Module* m : modules()) {
    if (hooks_.transient_working_weights)
      m->release_working_weights();
    else
      m->refresh_working_weights();
  }
}

std::vector<Module*> LanguageModule::modules() {
  std::vector<Module*> out;
  if (embedding_) out.push_back(embedding_.get());
  out.push_back(block_.get());
  if (post_process_)
    for (Module* m : head_modules()) out.push_back(m);
  return out;
}

int64_t LanguageModule::activation_rows(int64_t b, int64_t s) const {
  return tp_.sequence_parallel ? b * s / tp_.size() : b * s;
}

Parameter* LanguageModule::word_embedding() {
  if (cfg_.untie_embeddings_and_output_weights) return nullptr;
  if (embedding_) return &embedding_->word.param;
  if (output_layer_ && output_layer_->owns_weight()) return &output_layer_->weight().param;
  return nullptr;
}

OutputLayer& LanguageModule::make_output_layer(bool bias) {
  MG_CHECK(post_process_ && !output_layer_, "make_output_layer: not the last chunk, or twice");
  const bool tied = !cfg_.untie_embeddings_and_output_weights;
  if (embedding_ && tied)
    output_layer_ = std::make_unique<OutputLayer>(embedding_->word, cfg_.padded_vocab_size, tp_,
                                                  bias, cfg_.params_dtype,
                                                  !hooks_.transient_working_weights);
  else
    output_layer_ = std::make_unique<OutputLayer>(
        cfg_.padded_vocab_size, cfg_.hidden_size, cfg_.params_dtype, tp_, /*shared=*/tied,
        !hooks_.transient_working_weights, bias);
  return *output_layer_;
}

void LanguageModule::output_before_forward() {
  hooks_.before_forward(*output_layer_);
  if (hooks_.transient_working_weights && !output_layer_->owns_weight())
    output_layer_->weight().refresh();
}

void LanguageModule::output_after_forward() {
  hooks_.after_forward(*output_layer_);
  if (hooks_.transient_working_weights && !output_layer_->owns_weight())
    output_layer_->weight().release();
}

size_t LanguageModule::weight_bytes() const {
  std::vector<Tensor> ts;
  for (Module* m : const_cast<LanguageModule*>(this)->modules()) m->weight_tensors(ts);
  if (output_layer_)  // a tied table's working copy (the embedding's in this chunk)
    ts.push_back(output_layer_->weight().f32);
  return held_bytes({}, ts);
}

std::vector<MoELayer*> LanguageModule::moe_layers() {
  std::vector<MoELayer*> out;
  for (int l = 0; l < block_->num_layers(); ++l)
    if (MoELayer* m = block_->layer(l).moe()) out.push_back(m);
  return out;
}

void LanguageModule::all_reduce_sequence_parallel_grads() {
  model::all_reduce_sequence_parallel_grads(parameters(), tp_.comm());
}

// The layer context of one pass over `in`, with the checks every chunk shares: the sequence fits
// the position table, splits over TP under sequence parallelism and into two chunks under context
// parallelism; the masks have the tokens' shape.
LayerContext LanguageModule::make_ctx(const Batch& in, bool training, bool save,
                                      uint64_t offset) const {
  const Tensor& tokens = in.tokens;
  MG_REQUIRE(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::I32,
             "tokens must be an int32 [batch, seq] tensor");
  MG_REQUIRE(tokens.device() == device_, "the model's inputs must be on its device ",
             device_.to_string(), " (tokens are on ", tokens.device().to_string(), ")");
  MG_REQUIRE(offset < (uint64_t(1) << 40), "dropout offset ", offset, " must be below 2^40");
  LayerContext ctx;
  ctx.training = training;
  ctx.save = save;
  ctx.recompute_core_attention = cfg_.selective_recompute();
  ctx.seed = seed_;
  ctx.dropout_offset = offset;
  ctx.batch = tokens.size(0);
  ctx.seq = tokens.size(1);
  ctx.cp_rank = cp_.rank();
  ctx.cp_size = cp_.size();
  MG_REQUIRE(cp_.size() == 1 || ctx.seq % 2 == 0, "context parallelism: the local sequence of ",
             ctx.seq, " tokens must be two equal chunks (slice_for_context_parallel)");
  MG_REQUIRE(ctx.seq * cp_.size() <= cfg_.max_position_embeddings, "sequence length ",
             ctx.seq * cp_.size(), " exceeds --max-position-embeddings ",
             cfg_.max_position_embeddings);
  MG_REQUIRE(!tp_.sequence_parallel || ctx.seq % tp_.size() == 0, "sequence length ", ctx.seq,
             " is not divisible by the tensor-parallel size ", tp_.size(),
             " (required by --sequence-parallel)");
  auto check_mask = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return Tensor();
    MG_REQUIRE(t.dtype() == DType::I32 && t.shape() == tokens.shape(), what,
               " must be int32 with the tokens' shape ", shape_str(tokens.shape()));
    return t.contiguous();
  };
  ctx.attention_start = check_mask(in.attention_start, "attention_start");
  ctx.key_padding = check_mask(in.padding_mask, "padding_mask");
  MG_REQUIRE(!ctx.key_padding.defined() || !cfg_.causal(),
             "a padding mask needs bidirectional attention (causal models mask the future)");
  if (cfg_.rope()) {  // each token's position in the whole sequence
    std::vector<int32_t> pos(size_t(ctx.rows()));
    for (int64_t b = 0; b < ctx.batch; ++b)
      for (int64_t i = 0; i < ctx.seq; ++i)
        pos[size_t(b * ctx.seq + i)] =
            int32_t(context_parallel_position(i, ctx.seq, cp_.rank(), cp_.size()));
    ctx.rope_positions = Tensor::from_vector(pos, {ctx.rows()}).to(device_);
  }
  return ctx;
}

Tensor LanguageModule::embed(const LayerContext& ctx, const Batch& in) {
  hooks_.before_forward(*embedding_);
  Tensor x = embedding_->forward(
      ctx, in.tokens.contiguous(), in.position_ids.defined() ? in.position_ids.contiguous() : Tensor(),
      in.token_types.defined() ? in.token_types.contiguous() : Tensor());
  if (!ctx.save) hooks_.after_forward(*embedding_);
  return x;
}

size_t LanguageModule::held(const InFlight& st, const std::vector<const Module*>& live) const {
  std::vector<Tensor> ts = st.embedding;
  st.block.append_tensors(ts);
  if (st.dout.defined()) ts.push_back(st.dout);
  return held_bytes(live, ts);
}

Tensor LanguageModule::forward(int64_t mb, const Batch& in, const Tensor& x_in,
                               const ChunkForward& opt, LossResult* loss) {
  MG_CHECK(!in_flight_.count(mb), "model chunk forward: micro-batch ", mb, " is already in flight");
  MG_CHECK(!post_process_ || loss != nullptr, "model chunk forward: the last chunk needs a LossResult");
  InFlight st;
  st.ctx = make_ctx(in, opt.training, opt.training, opt.dropout_offset);
  st.ctx.moe_aux_grad_scale = opt.moe_aux_grad_scale;
  const LayerContext& ctx = st.ctx;
  Tensor x;
  if (embedding_) {
    x = embed(ctx, in);
    if (ctx.save) st.embedding = embedding_->take_saved();
  } else {
    const int64_t R = activation_rows(ctx.batch, ctx.seq);
    MG_CHECK(x_in.defined() && x_in.dim() == 2 && x_in.size(0) == R &&
                 x_in.size(1) == cfg_.hidden_size && x_in.dtype() == DType::F32,
             "model chunk forward: input activation ",
             x_in.defined() ? shape_str(x_in.shape()) : "undefined", " is not [", R, ", ",
             cfg_.hidden_size, "] fp32");
    x = x_in.contiguous();
  }
  x = block_->forward(ctx, x, ctx.save ? &st.block : nullptr);
  Tensor out = x;
  if (post_process_) {
    Tensor xf = block_->final_norm_forward(ctx, x);
    Tensor dxf;
    *loss = head_loss(ctx, xf, in, opt.grad_scale, ctx.save ? &dxf : nullptr);
    if (ctx.save) st.dout = block_->final_norm_backward(ctx, dxf);
    out = Tensor();
  }
  if (ctx.save) {
    activation_bytes_ = held(st, {});
    in_flight_.emplace(mb, std::move(st));
  }
  return out;
}

Tensor LanguageModule::backward(int64_t mb, const Tensor& dy) {
  auto it = in_flight_.find(mb);
  MG_CHECK(it != in_flight_.end(), "model chunk backward: micro-batch ", mb,
           " is not in flight (no training forward, or already backwarded)");
  InFlight st = std::move(it->second);
  in_flight_.erase(it);
  const LayerContext& ctx = st.ctx;
  Tensor dx;
  if (post_process_) {
    dx = std::exchange(st.dout, Tensor());
    // The loss head (final norm, head modules) was differentiated by the forward.
    hooks_.after_backward(block_->final_layernorm());
    for (Module* m : head_modules()) hooks_.after_backward(*m);
  } else {
    const int64_t R = activation_rows(ctx.batch, ctx.seq);
    MG_CHECK(dy.defined() && dy.dim() == 2 && dy.size(0) == R &&
                 dy.size(1) == cfg_.hidden_size && dy.dtype() == DType::F32,
             "model chunk backward: output gradient is not [", R, ", ", cfg_.hidden_size,
             "] fp32");
    dx = dy.contiguous();
  }
  dx = block_->backward(ctx, dx, st.block, [&](const std::vector<const Module*>& live) {
    activation_bytes_ = std::max(activation_bytes_, held(st, live));
  });
  if (embedding_) {
    embedding_->restore_saved(std::move(st.embedding));
    embedding_->backward(ctx, dx);
    hooks_.after_backward(*embedding_);
    return Tensor();
  }
  return dx;
}

LossResult LanguageModule::forward_backward(const Batch& in, float grad_scale,
                                            uint64_t dropout_offset) {
  MG_CHECK(pre_process() && post_process(), "forward_backward needs the whole model");
  ChunkForward opt;
  opt.training = true;
  opt.grad_scale = grad_scale;
  opt.dropout_offset = dropout_offset;
  LossResult loss;
  forward(0, in, Tensor(), opt, &loss);
  backward(0, Tensor());
  return loss;
}

LossResult LanguageModule::forward_loss(const Batch& in) {
  MG_CHECK(pre_process() && post_process(), "forward_loss needs the whole model");
  ChunkForward opt;
  opt.training = false;
  LossResult loss;
  forward(-1, in, Tensor(), opt, &loss);
  return loss;
}

Tensor LanguageModule::forward_logits(const Batch& in) {
  MG_CHECK(pre_process() && post_process(), "forward_logits needs the whole model");
  const LayerContext ctx = make_ctx(in, false, false, 0);
  Tensor x = block_->forward(ctx, embed(ctx, in), nullptr);
  return head_logits(ctx, block_->final_norm_forward(ctx, x))
      .view({ctx.batch, ctx.seq, cfg_.padded_vocab_size});
}

Tensor LanguageModule::forward_logits(const Tensor& tokens, const Tensor& position_ids,
                                      const Tensor& attention_start, const Tensor& padding_mask) {
  Batch in;
  in.tokens = tokens;
  in.position_ids = position_ids;
  in.attention_start = attention_start;
  in.padding_mask = padding_mask;
  return forward_logits(in);
}

}  // namespace megatron::model
