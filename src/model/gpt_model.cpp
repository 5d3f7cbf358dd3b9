// GPTModel: embedding -> L pre-LN transformer layers -> final LayerNorm -> tied output layer ->
// softmax cross-entropy. The loss head runs in row chunks (one [chunk, V] logits buffer, turned
// into dlogits in place), so the full [b*s, V] logits are never materialised during training.
// Full recomputation keeps only chunk inputs in forward and reruns the chunk's forward (same
// dropout streams, hence identical masks) before its backward; selective recomputation keeps no
// s x s attention probabilities. Under tensor parallelism the layers communicate through their
// TensorParallel group; the model itself only validates sizes, slices the initial weights and
// hands the loss head the vocabulary shard.
#include "model/gpt_model.h"

#include <malloc.h>

#include <cmath>
#include <unordered_set>

#include "core/rng.h"
#include "kernels/ops.h"
#include "model/layers.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

void GPTConfig::validate() const {
  MG_REQUIRE(num_layers > 0, "--num-layers must be > 0 (got ", num_layers, ")");
  MG_REQUIRE(hidden_size > 0, "--hidden-size must be > 0 (got ", hidden_size, ")");
  MG_REQUIRE(num_attention_heads > 0, "--num-attention-heads must be > 0");
  MG_REQUIRE(kv_channels > 0 || hidden_size % num_attention_heads == 0, "--hidden-size ",
             hidden_size, " is not divisible by --num-attention-heads ", num_attention_heads,
             "; set --kv-channels or change the sizes");
  MG_REQUIRE(num_query_groups >= 0 && num_attention_heads % query_groups() == 0,
             "--num-attention-heads ", num_attention_heads,
             " must be a multiple of --num-query-groups ", query_groups());
  MG_REQUIRE(seq_length > 0, "--seq-length must be > 0");
  MG_REQUIRE(max_position_embeddings >= seq_length, "--max-position-embeddings (",
             max_position_embeddings, ") must be >= --seq-length (", seq_length, ")");
  MG_REQUIRE(padded_vocab_size > 0, "padded vocabulary size must be > 0");
  MG_REQUIRE(hidden_dropout >= 0 && hidden_dropout < 1, "--hidden-dropout must be in [0, 1)");
  MG_REQUIRE(attention_dropout >= 0 && attention_dropout < 1,
             "--attention-dropout must be in [0, 1)");
  MG_REQUIRE(params_dtype == DType::F32 || params_dtype == DType::BF16 ||
                 params_dtype == DType::F16,
             "params dtype must be float32, bfloat16 or float16");
  parse_cp_comm_type(cp_comm_type);  // throws naming --cp-comm-type
  const std::string& g = recompute_granularity;
  MG_REQUIRE(g.empty() || g == "full" || g == "selective", "--recompute-granularity '", g,
             "' is not one of: full, selective");
  if (g == "full") {
    MG_REQUIRE(recompute_method == "uniform" || recompute_method == "block",
               "--recompute-granularity full needs --recompute-method uniform or block");
    MG_REQUIRE(recompute_num_layers >= 1 && recompute_num_layers <= num_layers,
               "--recompute-num-layers must be in [1, --num-layers=", num_layers, "] (got ",
               recompute_num_layers, ")");
  } else {
    MG_REQUIRE(recompute_method.empty(), "--recompute-method ", recompute_method,
               " requires --recompute-granularity full");
  }
}

void GPTConfig::validate_tensor_parallel(int T) const {
  MG_REQUIRE(T >= 1, "--tensor-model-parallel-size must be >= 1 (got ", T, ")");
  if (T == 1) return;
  auto divisible = [&](int64_t v, const char* flag) {
    MG_REQUIRE(v % T == 0, flag, " ", v, " is not divisible by --tensor-model-parallel-size ", T,
               "; each tensor-parallel rank holds 1/", T, " of it");
  };
  divisible(hidden_size, "--hidden-size");
  divisible(num_attention_heads, "--num-attention-heads");
  divisible(query_groups(), num_query_groups > 0 ? "--num-query-groups" : "--num-attention-heads");
  divisible(ffn(), ffn_hidden_size > 0 ? "--ffn-hidden-size" : "4 * --hidden-size");
  MG_REQUIRE(padded_vocab_size % T == 0, "padded vocabulary size ", padded_vocab_size,
             " is not divisible by --tensor-model-parallel-size ", T,
             "; pad the vocabulary as Megatron does, to a multiple of "
             "--make-vocab-size-divisible-by * --tensor-model-parallel-size");
  MG_REQUIRE(!sequence_parallel || seq_length % T == 0, "--seq-length ", seq_length,
             " is not divisible by --tensor-model-parallel-size ", T,
             " (required by --sequence-parallel: each rank holds seq-length / TP of the tokens)");
}

// Each master weight is drawn whole, as the single-rank model draws it (stream 1000 + index in
// parameters()), and this rank keeps its slice: the result does not depend on the TP size.
void init_gpt_parameter(Parameter& p, size_t index, const GPTConfig& cfg, uint64_t seed,
                        const TensorParallel& tp) {
  const float out_std = cfg.init_method_std / std::sqrt(2.0f * float(cfg.num_layers));
  const std::string& n = p.name;
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  Tensor v = Tensor::zeros(full_shape(p, tp.size()), DType::F32);
  if (n.find("layernorm") != std::string::npos) {
    if (ends(".weight")) v.fill_(1.0);
  } else if (ends(".weight")) {
    const bool scaled = ends("linear_proj.weight") || ends("linear_fc2.weight");
    Philox(seed, 1000 + index).fill_normal(v.data<float>(), v.numel(), 0.0f,
                                           scaled ? out_std : cfg.init_method_std);
  }
  ops::cast(p.value, shard_along(v, p.partition_dim, tp.rank(), tp.size()));
}

namespace {
struct Chunk {
  int begin, end;
  bool recompute;
};
}  // namespace

struct GPTModel::Impl {
  GPTConfig cfg;
  uint64_t seed;
  TensorParallel tp;
  ContextParallel cp;
  Embedding embedding;
  std::vector<std::unique_ptr<TransformerLayer>> layers;
  LayerNorm final_layernorm;
  VocabParallelOutput output;
  std::vector<Chunk> chunks;
  std::vector<Tensor> chunk_inputs;  // [R, h] per recomputed chunk (forward_backward only)
  size_t activation_bytes = 0;
  GPTModel::GradReadyHook grad_ready;
  ForwardPreHook pre_hook;

  Impl(const GPTConfig& c, uint64_t s, const TensorParallel& t, const ContextParallel& cp_)
      : cfg(c),
        seed(s),
        tp(t),
        cp(cp_),
        embedding(c.padded_vocab_size, c.max_position_embeddings, c.hidden_size, c.hidden_dropout,
                  c.params_dtype, t),
        final_layernorm("decoder.final_layernorm", c.hidden_size, c.layernorm_epsilon,
                        c.params_dtype, t.sequence_parallel),
        output(embedding.word, c.padded_vocab_size, t) {
    AttentionDims dims{c.num_attention_heads, c.query_groups(), c.head_dim(), c.attention_dropout};
    for (int i = 0; i < c.num_layers; ++i)
      layers.push_back(std::make_unique<TransformerLayer>(i, c.hidden_size, c.ffn(), dims,
                                                          c.layernorm_epsilon, c.hidden_dropout,
                                                          c.gelu_tanh, c.params_dtype, t, cp));
    const int L = c.num_layers, k = c.recompute_num_layers;
    if (c.recompute_granularity == "full" && c.recompute_method == "uniform") {
      for (int i = 0; i < L; i += k) chunks.push_back({i, std::min(L, i + k), true});
    } else {
      const int nrec = c.recompute_granularity == "full" ? k : 0;  // block: first k layers
      for (int i = 0; i < L; ++i) chunks.push_back({i, i + 1, i < nrec});
    }
  }

  ParameterList parameters() {
    ParameterList out;
    embedding.parameters(out);
    for (auto& l : layers) l->parameters(out);
    final_layernorm.parameters(out);
    return out;
  }

  void init_weights() {
    ParameterList ps = parameters();
    for (size_t i = 0; i < ps.size(); ++i) init_gpt_parameter(*ps[i], i, cfg, seed, tp);
    refresh();
  }

  void refresh() {
    embedding.refresh_working_weights();
    for (auto& l : layers) l->refresh_working_weights();
    final_layernorm.refresh_working_weights();
  }

  // Before a module's forward: the pre-hook with its parameters, then its working weights.
  template <class Module>
  void prepare(Module& module) {
    call_with_parameters(pre_hook, module);
    module.refresh_working_weights();
  }

  LayerContext make_ctx(const Tensor& tokens, const Tensor& start, bool training, bool save,
                        uint64_t offset) const {
    return make_layer_context(cfg, seed, tp, cp, tokens, start, training, save, offset);
  }


  // Collects the bytes of every activation currently held for backward (shared storage once).
  size_t held_bytes() const {
    std::unordered_set<const void*> seen;
    size_t total = 0;
    auto add = [&](const Tensor& t) {
      if (t.defined() && seen.insert(t.storage().get()).second) total += t.storage()->bytes();
    };
    for (const Tensor& t : chunk_inputs) add(t);
    for (const auto& l : layers) {
      add(l->saved.x);
      add(l->saved.x2);
      for (const LayerNorm* ln : {&l->input_layernorm, &l->pre_mlp_layernorm}) {
        add(ln->saved.x);
        add(ln->saved.mean);
        add(ln->saved.rstd);
      }
      const auto& a = l->self_attention;
      for (const Tensor* t : {&a.saved.qkv, &a.saved.lse, &a.saved.probs, &a.saved.ctx,
                              &a.linear_qkv.saved.x, &a.linear_proj.saved.x})
        add(*t);
      for (const Tensor* t : {&l->mlp.saved.h1, &l->mlp.saved.a1, &l->mlp.linear_fc1.saved.x,
                              &l->mlp.linear_fc2.saved.x})
        add(*t);
    }
    add(final_layernorm.saved.x);
    add(final_layernorm.saved.mean);
    add(final_layernorm.saved.rstd);
    return total;
  }

  Tensor run_decoder(const LayerContext& ctx, Tensor x, bool keep_chunk_inputs) {
    LayerContext nosave = ctx;
    nosave.save = false;
    chunk_inputs.assign(chunks.size(), Tensor());
    for (size_t c = 0; c < chunks.size(); ++c) {
      const bool rec = ctx.save && chunks[c].recompute;
      if (rec && keep_chunk_inputs) chunk_inputs[c] = x;
      for (int l = chunks[c].begin; l < chunks[c].end; ++l) {
        prepare(*layers[size_t(l)]);
        x = layers[size_t(l)]->forward(rec ? nosave : ctx, x);
      }
    }
    return x;
  }

  // Loss over the final hidden states xf; when dxf is given also its gradient (masked_lm_loss).
  LossResult head(const Tensor& xf, const GPTInputs& in, float grad_scale, Tensor* dxf) {
    return masked_lm_loss(output, xf, in, grad_scale, dxf);
  }
};

GPTModel::GPTModel(const GPTConfig& cfg, uint64_t seed)
    : GPTModel(cfg, seed, TensorParallel::none().group) {}

GPTModel::GPTModel(const GPTConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group)
    : GPTModel(cfg, seed, std::move(tp_group), ContextParallel::none().group) {}

GPTModel::GPTModel(const GPTConfig& cfg, uint64_t seed, std::shared_ptr<Communicator> tp_group,
                   std::shared_ptr<Communicator> cp_group) {
  MG_CHECK(tp_group != nullptr, "GPTModel: null tensor-parallel group");
  MG_CHECK(cp_group != nullptr, "GPTModel: null context-parallel group");
  cfg.validate();
  cfg.validate_tensor_parallel(tp_group->size());
  // Activations are allocated per step; keep freed blocks (up to glibc's 32 MiB mmap limit) in
  // the heap so every step reuses already-mapped pages instead of page-faulting fresh mmaps.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  impl_ = std::make_unique<Impl>(cfg, seed,
                                 TensorParallel::make(std::move(tp_group), cfg.sequence_parallel),
                                 ContextParallel{std::move(cp_group), parse_cp_comm_type(cfg.cp_comm_type)});
  impl_->init_weights();
}
GPTModel::~GPTModel() = default;

ParameterList GPTModel::parameters() { return impl_->parameters(); }
const GPTConfig& GPTModel::config() const { return impl_->cfg; }
int GPTModel::tensor_parallel_size() const { return impl_->tp.size(); }
int GPTModel::tensor_parallel_rank() const { return impl_->tp.rank(); }
int GPTModel::context_parallel_size() const { return impl_->cp.size(); }
int GPTModel::context_parallel_rank() const { return impl_->cp.rank(); }
bool GPTModel::sequence_parallel() const { return impl_->tp.sequence_parallel; }
void GPTModel::all_reduce_sequence_parallel_grads() {
  if (impl_->tp.sequence_parallel)
    model::all_reduce_sequence_parallel_grads(parameters(), impl_->tp.comm());
}
size_t GPTModel::activation_bytes() const { return impl_->activation_bytes; }
void GPTModel::set_grad_ready_hook(GradReadyHook hook) { impl_->grad_ready = std::move(hook); }
void GPTModel::set_forward_pre_hook(ForwardPreHook hook) { impl_->pre_hook = std::move(hook); }

LossResult GPTModel::forward_backward(const GPTInputs& in, float grad_scale,
                                      uint64_t dropout_offset) {
  MG_REQUIRE(dropout_offset < (uint64_t(1) << 40), "dropout offset ", dropout_offset,
             " must be below 2^40");
  Impl& m = *impl_;
  LayerContext ctx = m.make_ctx(in.tokens, in.attention_start, true, true, dropout_offset);
  check_gpt_targets(in);
  Tensor tokens = in.tokens.contiguous(), pos = in.position_ids.contiguous();
  m.prepare(m.embedding);
  Tensor x = m.embedding.forward(ctx, tokens, pos);
  x = m.run_decoder(ctx, x, true);
  m.prepare(m.final_layernorm);
  Tensor xf = m.final_layernorm.forward(ctx, x);
  size_t peak = m.held_bytes() + xf.nbytes();
  Tensor dxf;
  LossResult res = m.head(xf, in, grad_scale, &dxf);
  xf = Tensor();
  Tensor dx = m.final_layernorm.backward(ctx, dxf);
  dxf = Tensor();
  auto report = [&](auto& module) { call_with_parameters(m.grad_ready, module); };
  report(m.final_layernorm);
  for (size_t c = m.chunks.size(); c-- > 0;) {
    const Chunk& ch = m.chunks[c];
    if (ch.recompute) {  // rerun the chunk's forward with saving on (same dropout streams)
      Tensor y = m.chunk_inputs[c];
      for (int l = ch.begin; l < ch.end; ++l) y = m.layers[size_t(l)]->forward(ctx, y);
      peak = std::max(peak, m.held_bytes());
      m.chunk_inputs[c] = Tensor();
    }
    for (int l = ch.end; l-- > ch.begin;) {
      dx = m.layers[size_t(l)]->backward(ctx, dx);
      report(*m.layers[size_t(l)]);
    }
  }
  m.embedding.backward(ctx, dx);
  report(m.embedding);
  m.activation_bytes = peak;
  return res;
}

LossResult GPTModel::forward_loss(const GPTInputs& in) {
  Impl& m = *impl_;
  LayerContext ctx = m.make_ctx(in.tokens, in.attention_start, false, false, 0);
  check_gpt_targets(in);
  m.prepare(m.embedding);
  Tensor x = m.embedding.forward(ctx, in.tokens.contiguous(), in.position_ids.contiguous());
  x = m.run_decoder(ctx, x, false);
  m.prepare(m.final_layernorm);
  Tensor xf = m.final_layernorm.forward(ctx, x);
  return m.head(xf, in, 0.0f, nullptr);
}

Tensor GPTModel::forward_logits(const Tensor& tokens, const Tensor& position_ids,
                                const Tensor& attention_start) {
  Impl& m = *impl_;
  LayerContext ctx = m.make_ctx(tokens, attention_start, false, false, 0);
  m.prepare(m.embedding);
  Tensor x = m.embedding.forward(ctx, tokens.contiguous(), position_ids.contiguous());
  x = m.run_decoder(ctx, x, false);
  m.prepare(m.final_layernorm);
  Tensor xf = m.final_layernorm.forward(ctx, x);
  return m.output.logits(xf).view({ctx.batch, ctx.seq, m.cfg.padded_vocab_size});
}

void check_gpt_targets(const GPTInputs& in) {
  MG_REQUIRE(in.labels.defined() && in.labels.dtype() == DType::I32 &&
                 in.labels.shape() == in.tokens.shape(),
             "labels must be int32 with the tokens' shape ", shape_str(in.tokens.shape()));
  MG_REQUIRE(in.loss_mask.defined() && in.loss_mask.dtype() == DType::F32 &&
                 in.loss_mask.shape() == in.tokens.shape(),
             "loss_mask must be float32 with the tokens' shape ", shape_str(in.tokens.shape()));
}

LossResult masked_lm_loss(VocabParallelOutput& output, const Tensor& xf, const GPTInputs& in,
                          float grad_scale, Tensor* dxf) {
  const int64_t N = in.tokens.numel();
  const Tensor mask = in.loss_mask.contiguous().view({N});
  Tensor loss = output.loss(xf, in.labels.contiguous().view({N}), mask, grad_scale, dxf);
  LossResult res;
  const float* lp = loss.data<float>();
  const float* mp = mask.data<float>();
  for (int64_t i = 0; i < N; ++i) {
    res.loss_sum += double(lp[i]) * double(mp[i]);
    res.num_tokens += double(mp[i]);
  }
  return res;
}

LayerContext make_layer_context(const GPTConfig& cfg, uint64_t seed, const TensorParallel& tp,
                                const ContextParallel& cp, const Tensor& tokens,
                                const Tensor& start, bool training, bool save, uint64_t offset) {
  MG_REQUIRE(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::I32,
             "tokens must be an int32 [batch, seq] tensor");
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
  MG_REQUIRE(ctx.seq <= cfg.max_position_embeddings, "sequence length ", ctx.seq,
             " exceeds --max-position-embeddings ", cfg.max_position_embeddings);
  MG_REQUIRE(!tp.sequence_parallel || ctx.seq % tp.size() == 0, "sequence length ", ctx.seq,
             " is not divisible by the tensor-parallel size ", tp.size(),
             " (required by --sequence-parallel)");
  if (start.defined()) {
    MG_REQUIRE(start.dtype() == DType::I32 && start.shape() == tokens.shape(),
               "attention_start must be int32 with the tokens' shape ",
               shape_str(tokens.shape()));
    ctx.attention_start = start.contiguous();
  }
  return ctx;
}

}  // namespace megatron::model
