// GPTModel: embedding (first chunk) -> decoder layers -> final norm and output layer with the loss
// (last chunk); see gpt_model.h. The loss head runs in row chunks (one [chunk, V/T] logits buffer,
// turned into dlogits in place), so the full [b*s, V] logits are never materialised in training.
// Full recomputation keeps only block inputs in forward and reruns the block's forward (same
// dropout streams, hence identical masks) before its backward; selective recomputation keeps no
// s x s attention probabilities.
#include "model/gpt_model.h"

#include <malloc.h>

#include <cmath>
#include <map>
#include <unordered_set>
#include <utility>

#include "core/rng.h"
#include "kernels/ops.h"
#include "model/inference_context.h"
#include "model/layer_spec.h"
#include "model/norm.h"
#include "model/parallel_layers.h"
#include "model/transformer_layer.h"

namespace megatron::model {

// Each master weight is drawn whole, as the single-rank model draws it (stream 1000 + index in
// parameters()), and this rank keeps its slice: the result does not depend on the TP size.
void init_gpt_parameter(Parameter& p, size_t index, const TransformerConfig& cfg, uint64_t seed,
                        const TensorParallel& tp) {
  const float out_std = cfg.init_method_std / std::sqrt(2.0f * float(cfg.num_layers));
  const std::string& n = p.name;
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  Tensor v = Tensor::zeros(full_shape(p, tp.size()), DType::F32);
  if (n.find("layernorm") != std::string::npos) {
    if (ends(".weight") && !cfg.apply_layernorm_1p) v.fill_(1.0);
  } else if (ends(".weight")) {
    const bool scaled = ends("linear_proj.weight") || ends("linear_fc2.weight");
    Philox(seed, 1000 + index).fill_normal(v.data<float>(), v.numel(), 0.0f,
                                           scaled ? out_std : cfg.init_method_std);
  }
  ops::cast(p.value, shard_parameter(v, p, tp.rank(), tp.size()));
}

void check_gpt_targets(const GPTInputs& in) {
  MG_REQUIRE(in.labels.defined() && in.labels.dtype() == DType::I32 &&
                 in.labels.shape() == in.tokens.shape(),
             "labels must be int32 with the tokens' shape ", shape_str(in.tokens.shape()));
  MG_REQUIRE(in.loss_mask.defined() && in.loss_mask.dtype() == DType::F32 &&
                 in.loss_mask.shape() == in.tokens.shape(),
             "loss_mask must be float32 with the tokens' shape ", shape_str(in.tokens.shape()));
}

namespace {

struct RecomputeBlock {
  int begin, end;  // local layer indices
  bool recompute;
};

// The language-model loss of final hidden states xf ([N, h], or this rank's [N/T, h] under
// sequence parallelism): the mask-weighted sum and the token count; with dxf also its gradient
// (and the output weight's grad, +=).
LossResult masked_lm_loss(OutputLayer& output, const Tensor& xf, const GPTInputs& in,
                          float grad_scale, Tensor* dxf) {
  check_gpt_targets(in);
  const int64_t N = in.tokens.numel();
  const Tensor mask = in.loss_mask.contiguous().view({N});
  Tensor loss = output.loss(xf, in.labels.contiguous().view({N}), mask, grad_scale, dxf);
  LossResult res;
  res.loss_sum = ops::dot(loss, mask);
  res.num_tokens = ops::sum(mask);
  return res;
}

}  // namespace

struct GPTModel::Impl {
  TransformerConfig cfg;
  uint64_t seed;
  TensorParallel tp;
  ContextParallel cp;
  ModelChunk place;
  Device device;
  TransformerLayerSpec spec;
  int first_layer = 0;
  std::unique_ptr<Embedding> embedding;                 // first chunk
  std::vector<std::unique_ptr<TransformerLayer>> layers;
  std::unique_ptr<Norm> final_layernorm;                // last chunk
  std::unique_ptr<OutputLayer> output_layer;            // last chunk
  // Full recomputation works per chunk, as Megatron's TransformerBlock does per stage: "uniform"
  // recomputes groups of k of this chunk's layers, "block" the first k of them.
  std::vector<RecomputeBlock> blocks;

  struct InFlight {
    LayerContext ctx;
    ActivationStash embedding;
    std::vector<ActivationStash> layers;  // per local layer (non-recomputed)
    std::vector<Tensor> block_inputs;     // per recomputed block
    Tensor dout;                          // last chunk: grad of the decoder output
  };
  std::map<int64_t, InFlight> in_flight;
  ForwardPreHook pre_hook;
  GradReadyHook grad_ready;
  size_t activation_bytes = 0;
  bool transient_working_weights = false;  // !ModelOptions::grad (see there)

  Impl(const TransformerConfig& c, uint64_t s, const TensorParallel& t, const ContextParallel& cp_,
       const ModelChunk& m, const ModelOptions& opt)
      : cfg(c), seed(s), tp(t), cp(cp_), place(m), device(opt.device), spec(gpt_layer_spec(c)),
        transient_working_weights(!opt.grad) {
    const PipelineLayout& L = m.layout;
    first_layer = L.first_layer(m.pp_rank, m.chunk);
    const bool pre = L.has_embedding(m.pp_rank, m.chunk), post = L.has_output(m.pp_rank, m.chunk);
    if (pre)
      embedding = std::make_unique<Embedding>(
          c.padded_vocab_size, c.learned_position_embedding() ? c.max_position_embeddings : 0,
          c.hidden_size, c.hidden_dropout, c.params_dtype, t, opt.grad);
    for (int i = 0; i < L.layers_per_chunk(); ++i)
      layers.push_back(
          std::make_unique<TransformerLayer>(first_layer + i, c, spec, t, cp, opt.grad));
    if (post) {
      NormOptions no;
      no.eps = c.layernorm_epsilon;
      no.zero_centered_gamma = c.apply_layernorm_1p;
      no.partial_grad = t.sequence_parallel;
      no.grad = opt.grad;
      final_layernorm = std::make_unique<Norm>("decoder.final_layernorm", c.hidden_size,
                                               *spec.pre_mlp_layernorm, c.params_dtype, no);
      if (embedding && !c.untie_embeddings_and_output_weights)
        output_layer = std::make_unique<OutputLayer>(embedding->word, c.padded_vocab_size, t);
      else
        output_layer = std::make_unique<OutputLayer>(
            c.padded_vocab_size, c.hidden_size, c.params_dtype, t,
            /*shared=*/!c.untie_embeddings_and_output_weights, opt.grad);
    }
    const int n = int(layers.size()), k = c.recompute_num_layers;
    if (c.recompute_granularity == "full" && c.recompute_method == "uniform") {
      for (int i = 0; i < n; i += k) blocks.push_back({i, std::min(n, i + k), true});
    } else {
      const int nrec = c.recompute_granularity == "full" ? k : 0;
      for (int i = 0; i < n; ++i) blocks.push_back({i, i + 1, i < nrec});
    }
  }

  ParameterList parameters() {
    ParameterList out;
    if (embedding) embedding->parameters(out);
    for (auto& l : layers) l->parameters(out);
    if (final_layernorm) final_layernorm->parameters(out);
    if (output_layer) output_layer->parameters(out);  // nothing when tied in this chunk
    return out;
  }

  // Each parameter is drawn from the stream of its position in the single-rank parameters():
  // the embedding's, then every layer's, then the final norm's, then an untied output layer's.
  // The last stage's copy of a tied table draws the word table's (position 0).
  void init_weights() {
    const size_t num_embedding = cfg.learned_position_embedding() ? 2 : 1;
    auto init = [&](const ParameterList& ps, size_t first_index) {
      for (size_t j = 0; j < ps.size(); ++j)
        init_gpt_parameter(*ps[j], first_index + j, cfg, seed, tp);
    };
    if (embedding) init(embedding->parameters(), 0);
    const size_t per_layer = layers.front()->parameters().size();
    for (size_t l = 0; l < layers.size(); ++l)
      init(layers[l]->parameters(), num_embedding + (size_t(first_layer) + l) * per_layer);
    const size_t after_layers = num_embedding + size_t(cfg.num_layers) * per_layer;
    if (final_layernorm) init(final_layernorm->parameters(), after_layers);
    if (output_layer && output_layer->owns_weight()) {
      const bool tied_copy = !cfg.untie_embeddings_and_output_weights;
      init(output_layer->parameters(),
           tied_copy ? 0 : after_layers + final_layernorm->parameters().size());
    }
    refresh();
  }

  // Parameters and gradients (drawn or zeroed on the host) to the model's device, then the
  // working weights there (none of half-precision weights in a model without gradients).
  void move_to_device() {
    for (Parameter* p : parameters()) {
      if (p->value.device() != device) p->value = p->value.to(device);
      if (p->grad.defined() && p->grad.device() != device) p->grad = p->grad.to(device);
    }
    if (transient_working_weights)
      release_all();
    else
      refresh();
  }

  void refresh() {
    if (embedding) embedding->refresh_working_weights();
    for (auto& l : layers) l->refresh_working_weights();
    if (final_layernorm) final_layernorm->refresh_working_weights();
    if (output_layer) output_layer->refresh_working_weights();
  }

  // Before a module's forward: the pre-hook with its parameters, then its working weights (a
  // tied output layer's are the word table's, which an inference model dropped after the
  // embedding).
  void prepare(Module& module) {
    call_with_parameters(pre_hook, module);
    module.refresh_working_weights();
    if (transient_working_weights && &module == output_layer.get() && !output_layer->owns_weight())
      output_layer->weight().refresh();
  }
  // After a module's forward in a model without gradients: its working copies go (see
  // ModelOptions::grad).
  void done(Module& module) {
    if (!transient_working_weights) return;
    module.release_working_weights();
    if (&module == output_layer.get() && !output_layer->owns_weight())
      output_layer->weight().release();
  }
  void release_all() {
    if (embedding) done(*embedding);
    for (auto& l : layers) done(*l);
    if (final_layernorm) done(*final_layernorm);
    if (output_layer) done(*output_layer);
  }

  int64_t rows(int64_t b, int64_t s) const {
    return tp.sequence_parallel ? b * s / tp.size() : b * s;
  }

  // The layer context of one pass over `in` with the checks every chunk shares: the sequence
  // fits the position table, splits over TP under sequence parallelism and into two chunks under
  // context parallelism; the masks have the tokens' shape.
  LayerContext make_ctx(const GPTInputs& in, bool training, bool save, uint64_t offset) const {
    const Tensor& tokens = in.tokens;
    MG_REQUIRE(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::I32,
               "tokens must be an int32 [batch, seq] tensor");
    MG_REQUIRE(tokens.device() == device, "the model's inputs must be on its device ",
               device.to_string(), " (tokens are on ", tokens.device().to_string(), ")");
    MG_REQUIRE(offset < (uint64_t(1) << 40), "dropout offset ", offset, " must be below 2^40");
    LayerContext ctx;
    ctx.training = training;
    ctx.save = save;
    ctx.recompute_core_attention = cfg.recompute_granularity == "selective";
    ctx.seed = seed;
    ctx.dropout_offset = offset;
    ctx.batch = tokens.size(0);
    ctx.seq = tokens.size(1);
    ctx.cp_rank = cp.rank();
    ctx.cp_size = cp.size();
    MG_REQUIRE(cp.size() == 1 || ctx.seq % 2 == 0, "context parallelism: the local sequence of ",
               ctx.seq, " tokens must be two equal chunks (slice_for_context_parallel)");
    MG_REQUIRE(ctx.seq * cp.size() <= cfg.max_position_embeddings, "sequence length ",
               ctx.seq * cp.size(), " exceeds --max-position-embeddings ",
               cfg.max_position_embeddings);
    MG_REQUIRE(!tp.sequence_parallel || ctx.seq % tp.size() == 0, "sequence length ", ctx.seq,
               " is not divisible by the tensor-parallel size ", tp.size(),
               " (required by --sequence-parallel)");
    auto check_mask = [&](const Tensor& t, const char* what) {
      if (!t.defined()) return Tensor();
      MG_REQUIRE(t.dtype() == DType::I32 && t.shape() == tokens.shape(), what,
                 " must be int32 with the tokens' shape ", shape_str(tokens.shape()));
      return t.contiguous();
    };
    ctx.attention_start = check_mask(in.attention_start, "attention_start");
    ctx.key_padding = check_mask(in.padding_mask, "padding_mask");
    MG_REQUIRE(!ctx.key_padding.defined() || !cfg.causal(),
               "a padding mask needs bidirectional attention (causal models mask the future)");
    if (cfg.rope()) {  // each token's position in the whole sequence
      std::vector<int32_t> pos(size_t(ctx.rows()));
      for (int64_t b = 0; b < ctx.batch; ++b)
        for (int64_t i = 0; i < ctx.seq; ++i)
          pos[size_t(b * ctx.seq + i)] =
              int32_t(context_parallel_position(i, ctx.seq, cp.rank(), cp.size()));
      ctx.rope_positions = Tensor::from_vector(pos, {ctx.rows()}).to(device);
    }
    return ctx;
  }

  size_t held(const InFlight& st, const std::vector<const Module*>& live) const {
    std::vector<Tensor> ts = st.embedding;
    for (const ActivationStash& s : st.layers) ts.insert(ts.end(), s.begin(), s.end());
    ts.insert(ts.end(), st.block_inputs.begin(), st.block_inputs.end());
    if (st.dout.defined()) ts.push_back(st.dout);
    return held_bytes(live, ts);
  }

  void report(Module& module) { call_with_parameters(grad_ready, module); }
};

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed)
    : GPTModel(cfg, seed, TensorParallel::none().group) {}

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed,
                   std::shared_ptr<Communicator> tp_group)
    : GPTModel(cfg, seed, std::move(tp_group), ContextParallel::none().group) {}

namespace {
std::shared_ptr<Communicator> checked(std::shared_ptr<Communicator> g, const char* what) {
  MG_CHECK(g != nullptr, "GPTModel: null ", what, " group");
  return g;
}
}  // namespace

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed,
                   std::shared_ptr<Communicator> tp_group, std::shared_ptr<Communicator> cp_group)
    : GPTModel(cfg, seed,
               TensorParallel::make(checked(std::move(tp_group), "tensor-parallel"),
                                    cfg.sequence_parallel),
               ContextParallel{checked(std::move(cp_group), "context-parallel"),
                               parse_cp_comm_type(cfg.cp_comm_type)},
               ModelChunk{PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0}) {}

GPTModel::GPTModel(const TransformerConfig& cfg, uint64_t seed, const TensorParallel& tp,
                   const ContextParallel& cp, const ModelChunk& chunk, const ModelOptions& opt) {
  cfg.validate();
  cfg.validate_tensor_parallel(tp.size());
  cfg.validate_context_parallel(cp.size());
  MG_REQUIRE(cfg.num_layers == chunk.layout.num_layers, "GPTModel: --num-layers ", cfg.num_layers,
             " does not match the pipeline layout's ", chunk.layout.num_layers);
  chunk.layout.validate();
  MG_CHECK(chunk.pp_rank >= 0 && chunk.pp_rank < chunk.layout.pipeline_size && chunk.chunk >= 0 &&
               chunk.chunk < chunk.layout.num_chunks,
           "GPTModel: chunk ", chunk.chunk, " of pipeline rank ", chunk.pp_rank,
           " outside the layout");
  // Activations are allocated per step; keep freed blocks (up to glibc's 32 MiB mmap limit) in
  // the heap so every step reuses already-mapped pages instead of page-faulting fresh mmaps.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  impl_ = std::make_unique<Impl>(cfg, seed, tp, cp, chunk, opt);
  if (opt.init_weights) impl_->init_weights();
  impl_->move_to_device();
}
GPTModel::~GPTModel() = default;

ParameterList GPTModel::parameters() { return impl_->parameters(); }
bool GPTModel::pre_process() const { return impl_->embedding != nullptr; }
bool GPTModel::post_process() const { return impl_->output_layer != nullptr; }
int GPTModel::first_layer() const { return impl_->first_layer; }
int GPTModel::num_layers() const { return int(impl_->layers.size()); }
int64_t GPTModel::activation_rows(int64_t b, int64_t s) const { return impl_->rows(b, s); }
int GPTModel::in_flight() const { return int(impl_->in_flight.size()); }
void GPTModel::set_forward_pre_hook(ForwardPreHook hook) { impl_->pre_hook = std::move(hook); }
void GPTModel::set_grad_ready_hook(GradReadyHook hook) { impl_->grad_ready = std::move(hook); }
const TransformerConfig& GPTModel::config() const { return impl_->cfg; }
int GPTModel::tensor_parallel_size() const { return impl_->tp.size(); }
int GPTModel::tensor_parallel_rank() const { return impl_->tp.rank(); }
int GPTModel::context_parallel_size() const { return impl_->cp.size(); }
int GPTModel::context_parallel_rank() const { return impl_->cp.rank(); }
bool GPTModel::sequence_parallel() const { return impl_->tp.sequence_parallel; }
Device GPTModel::device() const { return impl_->device; }
size_t GPTModel::activation_bytes() const { return impl_->activation_bytes; }

size_t GPTModel::weight_bytes() const {
  const Impl& m = *impl_;
  std::vector<Tensor> ts;
  if (m.embedding) m.embedding->weight_tensors(ts);
  for (const auto& l : m.layers) l->weight_tensors(ts);
  if (m.final_layernorm) m.final_layernorm->weight_tensors(ts);
  if (m.output_layer) {
    m.output_layer->weight_tensors(ts);
    ts.push_back(m.output_layer->weight().f32);  // a tied table's (the embedding's in this chunk)
  }
  return held_bytes({}, ts);
}

Parameter* GPTModel::word_embedding() {
  if (impl_->cfg.untie_embeddings_and_output_weights) return nullptr;
  if (impl_->embedding) return &impl_->embedding->word.param;
  if (impl_->output_layer) return &impl_->output_layer->weight().param;
  return nullptr;
}

void GPTModel::all_reduce_sequence_parallel_grads() {
  model::all_reduce_sequence_parallel_grads(parameters(), impl_->tp.comm());
}

Tensor GPTModel::forward(int64_t mb, const GPTInputs& in, const Tensor& x_in,
                         const ChunkForward& opt, LossResult* loss) {
  Impl& m = *impl_;
  MG_CHECK(!m.in_flight.count(mb), "GPTModel::forward: micro-batch ", mb, " is already in flight");
  MG_CHECK(!m.output_layer || loss != nullptr, "GPTModel::forward: the last chunk needs a LossResult");
  Impl::InFlight st;
  st.ctx = m.make_ctx(in, opt.training, opt.training, opt.dropout_offset);
  const LayerContext& ctx = st.ctx;
  Tensor x;
  if (m.embedding) {
    m.prepare(*m.embedding);
    x = m.embedding->forward(ctx, in.tokens.contiguous(),
                             in.position_ids.defined() ? in.position_ids.contiguous() : Tensor());
    if (ctx.save) st.embedding = m.embedding->take_saved();
    else m.done(*m.embedding);
  } else {
    const int64_t R = m.rows(ctx.batch, ctx.seq);
    MG_CHECK(x_in.defined() && x_in.dim() == 2 && x_in.size(0) == R &&
                 x_in.size(1) == m.cfg.hidden_size && x_in.dtype() == DType::F32,
             "GPTModel::forward: input activation ",
             x_in.defined() ? shape_str(x_in.shape()) : "undefined", " is not [", R, ", ",
             m.cfg.hidden_size, "] fp32");
    x = x_in.contiguous();
  }
  LayerContext nosave = ctx;
  nosave.save = false;
  if (ctx.save) {
    st.layers.resize(m.layers.size());
    st.block_inputs.resize(m.blocks.size());
  }
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    const RecomputeBlock& blk = m.blocks[b];
    const bool rec = ctx.save && blk.recompute;
    if (rec) st.block_inputs[b] = x;
    for (int l = blk.begin; l < blk.end; ++l) {
      TransformerLayer& layer = *m.layers[size_t(l)];
      m.prepare(layer);
      x = layer.forward(rec ? nosave : ctx, x);
      if (ctx.save && !rec) st.layers[size_t(l)] = layer.take_saved();
      if (!ctx.save) m.done(layer);
    }
  }
  Tensor out = x;
  if (m.output_layer) {
    m.prepare(*m.final_layernorm);
    m.prepare(*m.output_layer);
    Tensor xf = m.final_layernorm->forward(ctx, x);
    Tensor dxf;
    *loss = masked_lm_loss(*m.output_layer, xf, in, opt.grad_scale, ctx.save ? &dxf : nullptr);
    if (ctx.save) st.dout = m.final_layernorm->backward(ctx, dxf);
    if (!ctx.save) {
      m.done(*m.final_layernorm);
      m.done(*m.output_layer);
    }
    out = Tensor();
  }
  if (ctx.save) {
    m.activation_bytes = m.held(st, {});
    m.in_flight.emplace(mb, std::move(st));
  }
  return out;
}

Tensor GPTModel::backward(int64_t mb, const Tensor& dy) {
  Impl& m = *impl_;
  auto it = m.in_flight.find(mb);
  MG_CHECK(it != m.in_flight.end(), "GPTModel::backward: micro-batch ", mb,
           " is not in flight (no training forward, or already backwarded)");
  Impl::InFlight st = std::move(it->second);
  m.in_flight.erase(it);
  const LayerContext& ctx = st.ctx;
  Tensor dx;
  if (m.output_layer) {
    dx = std::exchange(st.dout, Tensor());
    // The loss head (final norm, output weight) was differentiated by the forward.
    m.report(*m.final_layernorm);
    m.report(*m.output_layer);
  } else {
    const int64_t R = m.rows(ctx.batch, ctx.seq);
    MG_CHECK(dy.defined() && dy.dim() == 2 && dy.size(0) == R &&
                 dy.size(1) == m.cfg.hidden_size && dy.dtype() == DType::F32,
             "GPTModel::backward: output gradient is not [", R, ", ", m.cfg.hidden_size,
             "] fp32");
    dx = dy.contiguous();
  }
  for (size_t b = m.blocks.size(); b-- > 0;) {
    const RecomputeBlock& blk = m.blocks[b];
    if (blk.recompute) {  // rerun the block's forward with saving on (same dropout streams)
      Tensor y = std::exchange(st.block_inputs[b], Tensor());
      std::vector<const Module*> live;
      for (int l = blk.begin; l < blk.end; ++l) {
        y = m.layers[size_t(l)]->forward(ctx, y);
        live.push_back(m.layers[size_t(l)].get());
      }
      m.activation_bytes = std::max(m.activation_bytes, m.held(st, live));
    }
    for (int l = blk.end; l-- > blk.begin;) {
      TransformerLayer& layer = *m.layers[size_t(l)];
      if (!blk.recompute) layer.restore_saved(std::move(st.layers[size_t(l)]));
      dx = layer.backward(ctx, dx);
      m.report(layer);
    }
  }
  if (m.embedding) {
    m.embedding->restore_saved(std::move(st.embedding));
    m.embedding->backward(ctx, dx);
    m.report(*m.embedding);
    return Tensor();
  }
  return dx;
}

LossResult GPTModel::forward_backward(const GPTInputs& in, float grad_scale,
                                      uint64_t dropout_offset) {
  MG_CHECK(pre_process() && post_process(), "GPTModel::forward_backward needs the whole model");
  ChunkForward opt;
  opt.training = true;
  opt.grad_scale = grad_scale;
  opt.dropout_offset = dropout_offset;
  LossResult loss;
  forward(0, in, Tensor(), opt, &loss);
  backward(0, Tensor());
  return loss;
}

LossResult GPTModel::forward_loss(const GPTInputs& in) {
  MG_CHECK(pre_process() && post_process(), "GPTModel::forward_loss needs the whole model");
  ChunkForward opt;
  opt.training = false;
  LossResult loss;
  forward(-1, in, Tensor(), opt, &loss);
  return loss;
}

Tensor GPTModel::forward_logits(const Tensor& tokens, const Tensor& position_ids,
                                const Tensor& attention_start, const Tensor& padding_mask) {
  Impl& m = *impl_;
  MG_CHECK(pre_process() && post_process(), "GPTModel::forward_logits needs the whole model");
  GPTInputs in;
  in.tokens = tokens;
  in.position_ids = position_ids;
  in.attention_start = attention_start;
  in.padding_mask = padding_mask;
  LayerContext ctx = m.make_ctx(in, false, false, 0);
  m.prepare(*m.embedding);
  Tensor x = m.embedding->forward(ctx, tokens.contiguous(),
                                  position_ids.defined() ? position_ids.contiguous() : Tensor());
  m.done(*m.embedding);
  for (auto& l : m.layers) {
    m.prepare(*l);
    x = l->forward(ctx, x);
    m.done(*l);
  }
  m.prepare(*m.final_layernorm);
  m.prepare(*m.output_layer);
  Tensor xf = m.final_layernorm->forward(ctx, x);
  Tensor logits = m.output_layer->logits(xf).view({ctx.batch, ctx.seq, m.cfg.padded_vocab_size});
  m.done(*m.final_layernorm);
  m.done(*m.output_layer);
  return logits;
}

void GPTModel::allocate_inference(InferenceContext& ic, int64_t slots, int64_t max_len) const {
  const Impl& m = *impl_;
  MG_REQUIRE(max_len >= 1 && max_len <= m.cfg.max_position_embeddings, "sequence length ",
             max_len, " exceeds max_position_embeddings ", m.cfg.max_position_embeddings);
  ic.allocate(m.cfg.num_layers, slots, m.cfg.query_groups(), max_len, m.cfg.head_dim(), m.device);
}

Tensor GPTModel::forward_inference(const Tensor& tokens, InferenceContext& ic,
                                   const Tensor& logit_rows) {
  Impl& m = *impl_;
  MG_CHECK(pre_process() && post_process() && m.tp.size() == 1 && m.cp.size() == 1,
           "GPTModel::forward_inference needs the whole model on one rank");
  const int64_t n = tokens.numel();
  MG_CHECK(tokens.dtype() == DType::I32 && ic.row_slot.numel() == n && ic.row_pos.numel() == n,
           "forward_inference: ", n, " tokens need as many slots and positions");
  LayerContext ctx;
  ctx.batch = 1;
  ctx.seq = n;
  ctx.seed = m.seed;
  ctx.inference = &ic;
  if (m.cfg.rope()) ctx.rope_positions = ic.row_pos;
  m.prepare(*m.embedding);
  Tensor x = m.embedding->forward(ctx, tokens.view({1, n}), ic.row_pos.view({1, n}));
  m.done(*m.embedding);
  for (auto& l : m.layers) {
    m.prepare(*l);
    x = l->forward(ctx, x);
    m.done(*l);
  }
  Tensor picked = Tensor::empty({logit_rows.numel(), x.size(1)}, DType::F32, x.device());
  ops::index_select_rows(picked, x, logit_rows);
  m.prepare(*m.final_layernorm);
  m.prepare(*m.output_layer);
  Tensor logits = m.output_layer->logits(m.final_layernorm->forward(ctx, picked));
  m.done(*m.final_layernorm);
  m.done(*m.output_layer);
  return logits;
}

}  // namespace megatron::model
