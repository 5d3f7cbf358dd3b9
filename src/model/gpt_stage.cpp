// Model chunks of a pipeline-parallel GPT and the stage that holds them (see gpt_stage.h).
// A chunk runs the same layers as GPTModel; what differs is that several micro-batches are in
// flight, so the layers' saved activations are moved into a per-micro-batch stash after each
// forward and back before the matching backward, and that the loss head is differentiated during
// the last chunk's forward (its fused cross entropy gives dlogits with the loss), leaving only the
// [rows, h] gradient of the decoder output in flight.
#include "model/gpt_stage.h"

#include <malloc.h>

#include <algorithm>
#include <utility>

#include "kernels/ops.h"

namespace megatron::model {

PipelineLayout PipelineLayout::make(int L, int P, int layers_per_virtual_stage) {
  MG_REQUIRE(L > 0, "--num-layers must be > 0 (got ", L, ")");
  MG_REQUIRE(P >= 1, "--pipeline-model-parallel-size must be >= 1 (got ", P, ")");
  MG_REQUIRE(L % P == 0, "--num-layers ", L, " is not divisible by --pipeline-model-parallel-size ",
             P, "; each pipeline stage holds num-layers / pipeline-model-parallel-size layers");
  PipelineLayout l;
  l.num_layers = L;
  l.pipeline_size = P;
  if (layers_per_virtual_stage > 0) {
    MG_REQUIRE(P > 1, "--num-layers-per-virtual-pipeline-stage needs "
               "--pipeline-model-parallel-size > 1 (the interleaved schedule)");
    const int per_stage = L / P;
    MG_REQUIRE(per_stage % layers_per_virtual_stage == 0, "the ", per_stage,
               " layers of each pipeline stage (--num-layers ", L,
               " / --pipeline-model-parallel-size ", P,
               ") are not divisible by --num-layers-per-virtual-pipeline-stage ",
               layers_per_virtual_stage);
    l.num_chunks = per_stage / layers_per_virtual_stage;
  } else {
    MG_REQUIRE(layers_per_virtual_stage == 0,
               "--num-layers-per-virtual-pipeline-stage must be > 0 (got ",
               layers_per_virtual_stage, ")");
  }
  l.validate();
  return l;
}

void PipelineLayout::validate() const {
  MG_REQUIRE(num_layers > 0 && pipeline_size >= 1 && num_chunks >= 1 &&
                 num_layers % (pipeline_size * num_chunks) == 0 &&
                 (num_chunks == 1 || pipeline_size > 1),
             "pipeline layout of ", num_layers, " layers over ", pipeline_size, " stages x ",
             num_chunks, " virtual stages: the layers must split evenly (and virtual stages need "
             "more than one pipeline stage)");
}

namespace {
struct RecomputeBlock {
  int begin, end;  // local layer indices
  bool recompute;
};
}  // namespace

struct GPTChunk::Impl {
  GPTConfig cfg;
  uint64_t seed;
  TensorParallel tp;
  ContextParallel cp;
  int first_layer = 0;
  std::unique_ptr<Embedding> embedding;                 // first chunk
  std::vector<std::unique_ptr<TransformerLayer>> layers;
  std::unique_ptr<LayerNorm> final_layernorm;           // last chunk
  std::unique_ptr<Weight> output_weight;                // last chunk without the embedding
  std::unique_ptr<VocabParallelOutput> output;          // last chunk
  // Full recomputation works per chunk, as Megatron's TransformerBlock does per stage: "uniform"
  // recomputes groups of k of this chunk's layers, "block" the first k of them.
  std::vector<RecomputeBlock> blocks;

  struct InFlight {
    LayerContext ctx;
    Embedding::Saved embedding;
    std::vector<TransformerLayer::SavedState> layers;  // per local layer (non-recomputed)
    std::vector<Tensor> block_inputs;                  // per recomputed block
    Tensor dout;                                       // last chunk: grad of the decoder output
  };
  std::map<int64_t, InFlight> in_flight;
  ForwardPreHook pre_hook;
  GPTChunk::GradReadyHook grad_ready;

  template <class Module>
  void report(Module& module) {
    call_with_parameters(grad_ready, module);
  }

  Impl(const GPTConfig& c, uint64_t s, const TensorParallel& t, const PipelineLayout& layout,
       int pp_rank, int chunk, const ContextParallel& cp_)
      : cfg(c), seed(s), tp(t), cp(cp_), first_layer(layout.first_layer(pp_rank, chunk)) {
    if (layout.has_embedding(pp_rank, chunk))
      embedding = std::make_unique<Embedding>(c.padded_vocab_size, c.max_position_embeddings,
                                              c.hidden_size, c.hidden_dropout, c.params_dtype, t);
    AttentionDims dims{c.num_attention_heads, c.query_groups(), c.head_dim(), c.attention_dropout};
    for (int i = 0; i < layout.layers_per_chunk(); ++i)
      layers.push_back(std::make_unique<TransformerLayer>(first_layer + i, c.hidden_size, c.ffn(),
                                                          dims, c.layernorm_epsilon,
                                                          c.hidden_dropout, c.gelu_tanh,
                                                          c.params_dtype, t, cp));
    if (layout.has_output(pp_rank, chunk)) {
      final_layernorm = std::make_unique<LayerNorm>("decoder.final_layernorm", c.hidden_size,
                                                    c.layernorm_epsilon, c.params_dtype,
                                                    t.sequence_parallel);
      Weight* word = nullptr;
      if (embedding) {
        word = &embedding->word;
      } else {
        output_weight = std::make_unique<Weight>();
        output_weight->init("output_layer.weight", {c.padded_vocab_size / t.size(), c.hidden_size},
                            c.params_dtype, true, 0);
        output_weight->param.shared = true;
        word = output_weight.get();
      }
      output = std::make_unique<VocabParallelOutput>(*word, c.padded_vocab_size, t);
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
    if (output_weight) out.push_back(&output_weight->param);
    return out;
  }

  // Each parameter is drawn from the stream of its position in the single-rank
  // GPTModel::parameters(): the embedding's two tensors, then every layer's, then the final
  // LayerNorm's. The tied copy on the last stage draws the word table's (position 0).
  void init_weights() {
    constexpr size_t kEmbeddingParams = 2;  // word and position embeddings
    auto init = [&](const ParameterList& ps, size_t first_index) {
      for (size_t j = 0; j < ps.size(); ++j)
        init_gpt_parameter(*ps[j], first_index + j, cfg, seed, tp);
    };
    if (embedding) {
      ParameterList ps;
      embedding->parameters(ps);
      MG_CHECK(ps.size() == kEmbeddingParams, "embedding has ", ps.size(), " parameters");
      init(ps, 0);
    }
    size_t per_layer = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      ParameterList ps;
      layers[l]->parameters(ps);
      per_layer = ps.size();
      init(ps, kEmbeddingParams + (size_t(first_layer) + l) * per_layer);
    }
    if (final_layernorm) {
      ParameterList ps;
      final_layernorm->parameters(ps);
      init(ps, kEmbeddingParams + size_t(cfg.num_layers) * per_layer);
    }
    if (output_weight) init({&output_weight->param}, 0);
    refresh();
  }

  void refresh() {
    if (embedding) embedding->refresh_working_weights();
    for (auto& l : layers) l->refresh_working_weights();
    if (final_layernorm) final_layernorm->refresh_working_weights();
    if (output_weight) output_weight->refresh();
  }

  // Before a module's forward: the pre-hook with its parameters, then its working weights.
  template <class Module>
  void prepare(Module& module) {
    call_with_parameters(pre_hook, module);
    module.refresh_working_weights();
  }
  void prepare_output_weight() {
    if (!output_weight) return;
    if (pre_hook) pre_hook({&output_weight->param});
    output_weight->refresh();
  }

  int64_t rows(int64_t b, int64_t s) const {
    return tp.sequence_parallel ? b * s / tp.size() : b * s;
  }

  LayerContext make_ctx(const GPTInputs& in, bool training, uint64_t offset) const {
    MG_REQUIRE(offset < (uint64_t(1) << 40), "dropout offset ", offset, " must be below 2^40");
    return make_layer_context(cfg, seed, tp, cp, in.tokens, in.attention_start, training, training,
                              offset);
  }

  LossResult head(const Tensor& xf, const GPTInputs& in, float grad_scale, Tensor* dxf) {
    check_gpt_targets(in);
    return masked_lm_loss(*output, xf, in, grad_scale, dxf);
  }
};

GPTChunk::GPTChunk(const GPTConfig& cfg, uint64_t seed, const TensorParallel& tp,
                   const PipelineLayout& layout, int pp_rank, int chunk,
                   const ContextParallel& cp) {
  MG_CHECK(cfg.num_layers == layout.num_layers, "GPTChunk: config has ", cfg.num_layers,
           " layers, the pipeline layout ", layout.num_layers);
  MG_CHECK(pp_rank >= 0 && pp_rank < layout.pipeline_size && chunk >= 0 &&
               chunk < layout.num_chunks,
           "GPTChunk: chunk ", chunk, " of pipeline rank ", pp_rank, " outside the layout");
  impl_ = std::make_unique<Impl>(cfg, seed, tp, layout, pp_rank, chunk, cp);
  impl_->init_weights();
}
GPTChunk::~GPTChunk() = default;

ParameterList GPTChunk::parameters() { return impl_->parameters(); }
bool GPTChunk::has_embedding() const { return impl_->embedding != nullptr; }
bool GPTChunk::has_output() const { return impl_->output != nullptr; }
int GPTChunk::first_layer() const { return impl_->first_layer; }
int GPTChunk::num_layers() const { return int(impl_->layers.size()); }
int64_t GPTChunk::activation_rows(int64_t b, int64_t s) const { return impl_->rows(b, s); }
int GPTChunk::in_flight() const { return int(impl_->in_flight.size()); }
void GPTChunk::set_forward_pre_hook(ForwardPreHook hook) { impl_->pre_hook = std::move(hook); }
void GPTChunk::set_grad_ready_hook(GradReadyHook hook) { impl_->grad_ready = std::move(hook); }
Parameter* GPTChunk::word_embedding() {
  if (impl_->embedding) return &impl_->embedding->word.param;
  if (impl_->output_weight) return &impl_->output_weight->param;
  return nullptr;
}

Tensor GPTChunk::forward(int64_t mb, const GPTInputs& in, const Tensor& x_in,
                         const ChunkForward& opt, LossResult* loss) {
  Impl& m = *impl_;
  MG_CHECK(!m.in_flight.count(mb), "GPTChunk::forward: micro-batch ", mb, " is already in flight");
  MG_CHECK(!m.output || loss != nullptr, "GPTChunk::forward: the last chunk needs a LossResult");
  Impl::InFlight st;
  st.ctx = m.make_ctx(in, opt.training, opt.dropout_offset);
  const LayerContext& ctx = st.ctx;
  Tensor x;
  if (m.embedding) {
    MG_REQUIRE(in.position_ids.defined() && in.position_ids.dtype() == DType::I32,
               "position_ids must be an int32 [batch, seq] tensor");
    m.prepare(*m.embedding);
    x = m.embedding->forward(ctx, in.tokens.contiguous(), in.position_ids.contiguous());
    if (ctx.save) st.embedding = std::exchange(m.embedding->saved, {});
  } else {
    const int64_t R = m.rows(ctx.batch, ctx.seq);
    MG_CHECK(x_in.defined() && x_in.dim() == 2 && x_in.size(0) == R &&
                 x_in.size(1) == m.cfg.hidden_size && x_in.dtype() == DType::F32,
             "GPTChunk::forward: input activation ",
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
      m.prepare(*m.layers[size_t(l)]);
      x = m.layers[size_t(l)]->forward(rec ? nosave : ctx, x);
      if (ctx.save && !rec) st.layers[size_t(l)] = m.layers[size_t(l)]->take_saved();
    }
  }
  Tensor out = x;
  if (m.output) {
    m.prepare(*m.final_layernorm);
    m.prepare_output_weight();
    Tensor xf = m.final_layernorm->forward(ctx, x);
    Tensor dxf;
    *loss = m.head(xf, in, opt.grad_scale, ctx.save ? &dxf : nullptr);
    if (ctx.save) st.dout = m.final_layernorm->backward(ctx, dxf);
    out = Tensor();
  }
  if (ctx.save) m.in_flight.emplace(mb, std::move(st));
  return out;
}

Tensor GPTChunk::backward(int64_t mb, const Tensor& dy) {
  Impl& m = *impl_;
  auto it = m.in_flight.find(mb);
  MG_CHECK(it != m.in_flight.end(), "GPTChunk::backward: micro-batch ", mb,
           " is not in flight (no training forward, or already backwarded)");
  Impl::InFlight st = std::move(it->second);
  m.in_flight.erase(it);
  const LayerContext& ctx = st.ctx;
  Tensor dx;
  if (m.output) {
    dx = st.dout;
    // The loss head (final LayerNorm, output weight) was differentiated by the forward.
    m.report(*m.final_layernorm);
    if (m.output_weight && m.grad_ready) m.grad_ready({&m.output_weight->param});
  } else {
    const int64_t R = m.rows(ctx.batch, ctx.seq);
    MG_CHECK(dy.defined() && dy.dim() == 2 && dy.size(0) == R &&
                 dy.size(1) == m.cfg.hidden_size && dy.dtype() == DType::F32,
             "GPTChunk::backward: output gradient is not [", R, ", ", m.cfg.hidden_size,
             "] fp32");
    dx = dy.contiguous();
  }
  for (size_t b = m.blocks.size(); b-- > 0;) {
    const RecomputeBlock& blk = m.blocks[b];
    if (blk.recompute) {  // rerun the block's forward with saving on (same dropout streams)
      Tensor y = st.block_inputs[b];
      for (int l = blk.begin; l < blk.end; ++l) y = m.layers[size_t(l)]->forward(ctx, y);
      st.block_inputs[b] = Tensor();
    }
    for (int l = blk.end; l-- > blk.begin;) {
      if (!blk.recompute) m.layers[size_t(l)]->restore_saved(std::move(st.layers[size_t(l)]));
      dx = m.layers[size_t(l)]->backward(ctx, dx);
      m.report(*m.layers[size_t(l)]);
    }
  }
  if (m.embedding) {
    m.embedding->saved = std::move(st.embedding);
    m.embedding->backward(ctx, dx);
    m.report(*m.embedding);
    return Tensor();
  }
  return dx;
}

// ---- GPTStageModel -------------------------------------------------------------------------
GPTStageModel::GPTStageModel(const GPTConfig& cfg, uint64_t seed, const ParallelState& ps,
                             int layers_per_virtual_stage)
    : GPTStageModel(cfg, seed,
                    PipelineLayout::make(cfg.num_layers, ps.pp_size(), layers_per_virtual_stage),
                    ps.pp_rank(), ps.group_ptr(GroupKind::TP), ps.group_ptr(GroupKind::PP),
                    ps.group_ptr(GroupKind::EMBEDDING), ps.group_ptr(GroupKind::CP)) {}

GPTStageModel::GPTStageModel(const GPTConfig& cfg, uint64_t seed, const PipelineLayout& layout,
                             int pp_rank, std::shared_ptr<Communicator> tp_group,
                             std::shared_ptr<Communicator> pp_group,
                             std::shared_ptr<Communicator> embedding_group,
                             std::shared_ptr<Communicator> cp_group)
    : cfg_(cfg), layout_(layout), pp_rank_(pp_rank) {
  cfg.validate();
  MG_CHECK(tp_group != nullptr, "GPTStageModel: null tensor-parallel group");
  cfg.validate_tensor_parallel(tp_group->size());
  MG_REQUIRE(cfg.num_layers == layout.num_layers, "GPTStageModel: --num-layers ", cfg.num_layers,
             " does not match the pipeline layout's ", layout.num_layers);
  layout.validate();
  MG_CHECK(pp_rank >= 0 && pp_rank < layout.pipeline_size, "pipeline rank ", pp_rank,
           " outside [0, ", layout.pipeline_size, ")");
  if (!pp_group) {
    MG_CHECK(layout.pipeline_size == 1, "GPTStageModel: no pipeline group for ",
             layout.pipeline_size, " stages");
    pp_group = make_self_communicator("pp");
  }
  MG_CHECK(pp_group->size() == layout.pipeline_size && pp_group->rank() == pp_rank,
           "GPTStageModel: pipeline group of ", pp_group->size(), " (rank ", pp_group->rank(),
           ") does not match the layout's ", layout.pipeline_size, " stages (rank ", pp_rank, ")");
  pp_group_ = std::move(pp_group);
  embedding_group_ = std::move(embedding_group);
  if (layout.pipeline_size > 1 && (is_first_stage() || is_last_stage()))
    MG_CHECK(embedding_group_ && embedding_group_->size() == 2,
             "GPTStageModel: the first and last pipeline stages need the embedding group");
  // As GPTModel: keep freed activation blocks in the heap between steps.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  tp_ = TensorParallel::make(std::move(tp_group), cfg.sequence_parallel);
  ContextParallel cp = cp_group ? ContextParallel{std::move(cp_group)} : ContextParallel::none();
  cp.comm = parse_cp_comm_type(cfg.cp_comm_type);
  for (int c = 0; c < layout.num_chunks; ++c)
    chunks_.push_back(std::make_unique<GPTChunk>(cfg, seed, tp_, layout, pp_rank, c, cp));
}
GPTStageModel::~GPTStageModel() = default;

void GPTStageModel::set_forward_pre_hook(const ForwardPreHook& hook) {
  for (auto& c : chunks_) c->set_forward_pre_hook(hook);
}

ParameterList GPTStageModel::parameters() {
  ParameterList out;
  for (auto& c : chunks_) {
    ParameterList p = c->parameters();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

void GPTStageModel::all_reduce_sequence_parallel_grads() {
  if (tp_.sequence_parallel) model::all_reduce_sequence_parallel_grads(parameters(), tp_.comm());
}

Parameter* GPTStageModel::shared_embedding() {
  if (layout_.pipeline_size == 1) return nullptr;
  if (is_first_stage()) return chunks_.front()->word_embedding();
  if (is_last_stage()) return chunks_.back()->word_embedding();
  return nullptr;
}

void GPTStageModel::all_reduce_embedding_grads() {
  Parameter* p = shared_embedding();
  if (!p) return;
  embedding_group_->all_reduce(p->grad, ReduceOp::Sum);
}

void GPTStageModel::sync_shared_embedding() {
  Parameter* p = shared_embedding();
  if (!p) return;
  embedding_group_->broadcast(p->value, 0);  // group rank 0 is the first stage
}

void GPTStageModel::finalize_model_parallel_grads() {
  all_reduce_sequence_parallel_grads();
  all_reduce_embedding_grads();
}

}  // namespace megatron::model
