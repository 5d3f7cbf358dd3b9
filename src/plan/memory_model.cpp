// This build's memory prediction (memory_model.h). The sizes mirror the model's constructors and
// saved-tensor declarations; tests hold them to the real model (parameter shapes, and
// model::LanguageModule::activation_bytes of a real forward) so the two cannot drift apart.
#include "plan/memory_model.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/layer_spec.h"
#include "model/moe/routing.h"
#include "model/pipeline_layout.h"
#include "optim/grad_buffer.h"
#include "pipeline/schedules.h"

namespace megatron::plan {

namespace {

constexpr int64_t kHeadRows = 256;  // the loss head's logits chunk (model/parallel_layers.cpp)
constexpr double kResidentBookkeeping = 4.0 * 1024 * 1024;  // heap metadata, MPI, small objects
// Blocks from this size on get their own mapping, returned when freed (core/tensor.cpp tune_host_allocator sets
// glibc's M_MMAP_THRESHOLD); smaller freed blocks stay in the heap.
constexpr double kMmapThreshold = 32.0 * 1024 * 1024;
// The share of a step's freed heap temporaries that stays resident (fragmentation), measured on
// this build's CPU runs (0.16 to 0.65).
constexpr double kHeapRetention = 0.4;

// The tensor shapes of one micro-batch on one rank, in elements.
struct Geometry {
  int64_t b, s, N, R, h, T, C, heads, groups, d, F, V;
  bool sp, gated, mean, qk_norm, learned_pos, probs;
  // bf16 products (bf16 weights multiplied as stored): the norms and the activation that feed
  // only a product write bf16 (TransformerLayer::forward, MLP::forward), which the layers keep.
  bool bf16_products;
  // Mixture of experts (model/moe/): experts, an expert's and the shared expert's widths (0: no
  // shared expert), and M, the rows dispatched to the experts per micro-batch and MoE layer.
  int64_t E, Fe, Fs, M;
  int64_t up() const { return gated ? 2 : 1; }  // fc1 outputs per FFN column
  int64_t qkv_width() const { return groups * (heads / groups + 2) * d / T; }  // local columns
  int64_t ctx_width() const { return heads * d / T; }
  int64_t norm_stats() const { return R * (mean ? 2 : 1); }  // rstd (and mean) of a norm
  // n elements of a product's input in fp32 units (4 bytes): half as many when bf16 (rounded up
  // for an odd count).
  int64_t product_input(int64_t n) const { return bf16_products ? (n + 1) / 2 : n; }
};

// The rows an MoE layer dispatches to its experts for N tokens (routing.cpp): N x top-k; under a
// capacity that drops tokens (capacity <= N), E x capacity when padded to it, else at most that.
int64_t moe_rows(const model::TransformerConfig& m, int64_t N) {
  const int64_t routed = N * m.moe_router_topk;
  if (m.moe_expert_capacity_factor <= 0) return routed;
  const int64_t cap =
      model::expert_capacity(routed, m.num_moe_experts, m.moe_expert_capacity_factor);
  if (cap > N) return routed;
  const int64_t padded = int64_t(m.num_moe_experts) * cap;
  return m.moe_pad_expert_input_to_capacity ? padded : std::min(routed, padded);
}

Geometry geometry(const PlanInput& in) {
  const model::TransformerConfig& m = in.args.model;
  const Layout& l = in.layout;
  Geometry g{};
  g.b = in.args.micro_batch_size;
  g.C = l.cp;
  g.s = m.seq_length / l.cp;
  g.N = g.b * g.s;
  g.T = l.tp;
  g.sp = m.sequence_parallel && l.tp > 1;
  g.R = g.sp ? g.N / g.T : g.N;
  g.h = m.hidden_size;
  g.heads = m.num_attention_heads;
  g.groups = m.query_groups();
  g.d = m.head_dim();
  g.F = m.ffn();
  g.V = m.padded_vocab_size;
  g.gated = model::activation_kind(m.activation).gated;
  g.mean = model::norm_kind(m.normalization).saves_mean;
  g.qk_norm = m.qk_layernorm;
  g.learned_pos = m.learned_position_embedding();
  g.bf16_products = m.params_dtype == DType::BF16 && ops::gemm_computes_in(DType::BF16, Device::cpu());
  const bool ring = l.cp > 1 && m.cp_comm_type_id() == model::CpCommTypeId::p2p;
  g.probs = in.keeps_attention_probs && !m.selective_recompute() && !ring;
  if (m.num_moe_experts > 0) {
    g.E = m.num_moe_experts;
    g.Fe = m.moe_ffn();
    g.Fs = m.moe_shared_expert_intermediate_size;
    g.M = moe_rows(m, g.N);
  }
  return g;
}

// Elements one layer keeps for backward (transformer_layer.h, attention.h, mlp.h, norm.h, and
// for an MoE layer moe/moe_layer.h, experts.h).
struct LayerSaved {
  int64_t attention = 0;  // input, norm output, norm statistics, QKV, q/k norms, lse, probs, ctx
  int64_t mlp = 0;        // residual after attention, its norm output and statistics, the FFN's
  int64_t qkv = 0, probs = 0, ctx = 0, lse = 0, h1 = 0, a1 = 0;
  bool moe = false;
  int64_t shared = 0;  // an MoE layer's shared expert: its fc1 output and activation
  int64_t total() const { return attention + mlp; }
};

LayerSaved layer_saved(const Geometry& g, bool moe) {
  LayerSaved s;
  const int64_t local_heads = g.heads / g.T, local_groups = g.groups / g.T;
  s.qkv = g.N * g.qkv_width();
  s.lse = g.b * local_heads * g.s;
  s.probs = g.probs ? g.b * local_heads * g.s * (g.C * g.s) : 0;
  s.ctx = g.N * g.ctx_width();
  int64_t qk = 0;
  if (g.qk_norm) {
    const int64_t per = g.mean ? 2 : 1;
    qk = g.N * local_heads * (g.d + per) + g.N * local_groups * (g.d + per);
  }
  // The layer's input and its norm's output (the QKV product's input).
  s.attention = g.R * g.h + g.product_input(g.R * g.h) + g.norm_stats() + s.qkv + qk + s.lse +
                s.probs + s.ctx;
  s.moe = moe;
  if (!moe) {
    s.h1 = g.N * g.F * g.up() / g.T;
    s.a1 = g.product_input(g.N * g.F / g.T);
    s.mlp = g.R * g.h + g.product_input(g.R * g.h) + g.norm_stats() + s.h1 + s.a1;
    return s;
  }
  // The MoE layer: the gate's logits [N, E], the dispatched rows [M, h] (the experts' fc1 input),
  // each expert's fc1 output and activation over its rows, the experts' outputs [M, h], and the
  // shared expert's MLP over every token.
  s.shared = g.N * g.Fs * g.up() / g.T + g.product_input(g.N * g.Fs / g.T);
  s.h1 = g.M * g.Fe * g.up() / g.T;
  s.a1 = g.product_input(g.M * g.Fe / g.T);
  s.mlp = 2 * g.R * g.h + g.norm_stats() + g.N * g.E + 2 * g.M * g.h + s.h1 + s.a1 + s.shared;
  return s;
}

// An MoE layer's largest forward transient beyond its saved tensors, in elements: the device
// logits, the dispatch plan's index and probabilities, the combined output [N, h], and then the
// probability-weighted rows [M, h] (before the shared expert saved anything) or the shared
// expert's output [N, h].
int64_t moe_forward_transient(const Geometry& g, const LayerSaved& s) {
  const int64_t Nh = g.N * g.h;
  return g.N * g.E + 2 * g.M + Nh + std::max(g.M * g.h - s.shared, g.Fs > 0 ? Nh : 0);
}

// The largest transient of one layer's backward beyond its saved tensors, in elements: the
// phases of TransformerLayer::backward (MLP or MoE, then attention) with what each has allocated
// and already freed.
int64_t layer_backward_transient(const Geometry& g, const LayerSaved& s) {
  const int64_t Rh = g.R * g.h, Nh = g.N * g.h, gather = g.sp ? Nh : 0;
  int64_t ffn = 0;
  if (!s.moe) {
    const int64_t da = g.N * g.F / g.T, dh = g.gated ? s.h1 : 0;
    const int64_t in_fc2 = Rh /*dy*/ + Rh /*dmo*/ + da + dh + gather;
    const int64_t in_fc1 = in_fc2 + Nh - (s.h1 + s.a1);
    ffn = std::max(in_fc2, in_fc1);
  } else {
    // MoELayer::backward: dy, dmo, the plan's index and probabilities; the shared expert's
    // backward (its fc2 input gradient and SwiGLU gradient, then dx) or zeros for dx; the
    // combine's row gradients [M, h] kept to the end; the experts' input gradients [M, h] while
    // the first expert (M / E rows) runs its backward.
    const int64_t base = 2 * Rh + 2 * g.M;
    const int64_t shared_da = g.N * g.Fs / g.T * (g.gated ? 3 : 1);
    const int64_t in_shared = g.Fs > 0 ? base + shared_da + std::max<int64_t>(0, Nh - s.shared)
                                       : base + Nh;
    const int64_t after_shared = base + Nh - s.shared;
    const int64_t in_combine = after_shared + 2 * g.M * g.h + 2 * g.M;
    const int64_t ne = (g.M + g.E - 1) / g.E;
    const int64_t expert_da = ne * g.Fe / g.T * (g.gated ? 3 : 1);
    const int64_t expert =
        expert_da + std::max<int64_t>(0, ne * g.h - ne * g.Fe * (g.up() + 1) / g.T);
    const int64_t in_experts = after_shared + 2 * g.M * g.h + expert;
    ffn = std::max({in_shared, in_combine, in_experts});
  }
  const int64_t mlp_freed = s.mlp - Rh;  // x2 stays with the layer until its end
  const int64_t dc = s.ctx, dqkv = s.qkv;
  const int64_t in_attention = 4 * Rh /*dy dmo dm dx2*/ + dc + dqkv + gather - mlp_freed;
  const int64_t in_qkv = in_attention + Nh - (s.qkv + s.lse + s.probs + s.ctx);
  return std::max({ffn, in_attention, in_qkv});
}

struct ChunkPlan {
  bool pre = false, post = false;
  int layers = 0;
  ChunkActivations act;       // bytes
  double recompute_live = 0;  // bytes a recomputed block adds while its backward runs
  double forward_extra = 0;   // bytes of the forward's transient at its end
  double backward_extra = 0;  // bytes of the backward's largest transient
  double mapped_saved = 0;    // saved bytes in tensors large enough for their own mapping
};

ChunkPlan plan_chunk(const PlanInput& in, const Geometry& g, int pp_rank, int chunk) {
  const model::TransformerConfig& m = in.args.model;
  const model::PipelineLayout L = model::PipelineLayout::make(
      m.num_layers, in.layout.pp, in.args.parallel.num_layers_per_virtual_pipeline_stage);
  ChunkPlan c;
  c.pre = L.has_embedding(pp_rank, chunk);
  c.post = L.has_output(pp_rank, chunk);
  c.layers = L.layers_per_chunk();
  std::vector<LayerSaved> layer;  // the chunk's layers, dense or MoE (--moe-layer-freq)
  for (int i = 0; i < c.layers; ++i)
    layer.push_back(layer_saved(g, m.is_moe_layer(L.first_layer(pp_rank, chunk) + i)));
  const int64_t Rh = g.R * g.h;
  // Full recomputation: blocks of k layers (uniform) or the first k layers (block) keep only
  // their input.
  int64_t saved = 0, recompute_live = 0;
  const int k = std::max(1, m.recompute_num_layers);
  if (m.full_recompute() && m.recompute_method_id() == model::RecomputeMethodId::uniform) {
    const int blocks = (c.layers + k - 1) / k;
    saved = int64_t(blocks) * Rh;
    for (int b = 0; b < blocks; ++b) {  // backward of block b: inputs 0..b-1 and b's layers
      int64_t block = 0;
      for (int i = b * k; i < std::min(c.layers, (b + 1) * k); ++i) block += layer[size_t(i)].total();
      recompute_live = std::max(recompute_live, int64_t(b) * Rh + block);
    }
  } else if (m.full_recompute()) {
    const int nrec = std::min(k, c.layers);
    saved = int64_t(nrec) * Rh;
    for (int i = nrec; i < c.layers; ++i) saved += layer[size_t(i)].total();
    for (int i = 0; i < nrec; ++i)  // backward of layer i: inputs 0..i-1 and its own
      recompute_live = std::max(recompute_live, int64_t(i) * Rh + layer[size_t(i)].total());
  } else {
    for (const LayerSaved& s : layer) saved += s.total();
  }
  c.act.layers = 4.0 * double(saved);
  for (const LayerSaved& s : layer)
    if (4.0 * double(s.probs) >= kMmapThreshold && !m.full_recompute())
      c.mapped_saved += 4.0 * double(s.probs);
  c.act.embedding = c.pre ? 4.0 * double(g.N * (g.learned_pos ? 2 : 1)) : 0;
  c.act.output_grad = c.post ? 4.0 * double(Rh) : 0;
  c.recompute_live = 4.0 * double(recompute_live);
  c.act.recompute_live = c.recompute_live;
  // End of the forward: the last layer's attention and MLP outputs, or the loss head (final norm
  // output, gathered input under SP, per-token losses, input gradient, vocabulary-parallel cross
  // entropy's softmax of a logits chunk under TP); or earlier, inside an MoE layer, less what
  // the layers after it save.
  const int64_t head_rows = std::min(g.N, kHeadRows);
  const int64_t head = Rh + (g.sp ? g.N * g.h : 0) + g.N + g.N * g.h + Rh +
                       (g.T > 1 ? 2 * head_rows * (g.V / g.T) : 0);
  int64_t forward = c.post ? head : 2 * Rh;
  // The backward's largest transient: the layers run last to first, each beyond what the layers
  // before it still hold (all of a recomputed block's layers are held again).
  int64_t bwd = 0, after = 0;
  const bool full = m.full_recompute();
  for (int i = c.layers - 1; i >= 0; --i) {
    const LayerSaved& s = layer[size_t(i)];
    if (s.moe && !full) forward = std::max(forward, moe_forward_transient(g, s) - after);
    bwd = std::max(bwd, layer_backward_transient(g, s) - (full ? 0 : after));
    after += s.total();
  }
  c.forward_extra = 4.0 * double(forward);
  c.backward_extra = 4.0 * double(bwd) + (recompute_live > 0 ? c.recompute_live : 0);
  return c;
}

// Elements whose gradients are partial sums over TP (Parameter::sequence_parallel), which
// all_reduce_sequence_parallel_grads copies into one flat buffer: under sequence parallelism the
// norms, the row-parallel biases and the position table; per-head q/k norms under any TP.
int64_t partial_grad_numel(const PlanInput& in, const std::vector<ChunkPlan>& chunks) {
  const model::TransformerConfig& m = in.args.model;
  const bool sp = m.sequence_parallel && in.layout.tp > 1;
  const int64_t h = m.hidden_size, per_norm = model::norm_kind(m.normalization).has_bias ? 2 : 1;
  int64_t n = 0;
  for (const ChunkPlan& c : chunks) {
    if (sp && c.pre && m.learned_position_embedding()) n += int64_t(m.max_position_embeddings) * h;
    if (sp) n += int64_t(c.layers) * (2 * per_norm * h + (m.add_bias_linear ? 2 * h : 0));
    if (m.qk_layernorm && in.layout.tp > 1) n += int64_t(c.layers) * 2 * per_norm * m.head_dim();
    if (sp && c.post) n += per_norm * h;
  }
  return n;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

}  // namespace

std::vector<int64_t> chunk_parameter_numels(const PlanInput& in, int pp_rank, int chunk,
                                            std::vector<bool>* sharded,
                                            std::vector<bool>* products_only) {
  const model::TransformerConfig& m = in.args.model;
  const model::PipelineLayout L = model::PipelineLayout::make(
      m.num_layers, in.layout.pp, in.args.parallel.num_layers_per_virtual_pipeline_stage);
  const Geometry g = geometry(in);
  const bool norm_bias = model::norm_kind(m.normalization).has_bias;
  const int64_t h = g.h, T = g.T;
  std::vector<int64_t> out;
  std::vector<bool> split, product;
  // product: a weight only multiplied or looked up (Weight::read_as_stored: the linear layers'
  // weights and the word table), which a half-precision gemm reads without an fp32 copy.
  auto add = [&](int64_t numel, bool is_split, bool is_product = false) {
    out.push_back(numel);
    split.push_back(is_split);
    product.push_back(is_product);
  };
  auto norm = [&](int64_t width) {
    add(width, false);
    if (norm_bias) add(width, false);
  };
  const bool pre = L.has_embedding(pp_rank, chunk), post = L.has_output(pp_rank, chunk);
  if (pre) {
    add(g.V / T * h, true, true);
    if (g.learned_pos) add(int64_t(m.max_position_embeddings) * h, false);
  }
  auto mlp = [&](int64_t F) {  // linear_fc1 ([gate | up] when gated) and linear_fc2
    add(F * g.up() / T * h, true, true);
    if (m.add_bias_linear) add(F * g.up() / T, true);
    add(h * (F / T), true, true);
    if (m.add_bias_linear) add(h, false);
  };
  for (int i = 0; i < L.layers_per_chunk(); ++i) {
    norm(h);
    add(g.qkv_width() * h, true, true);
    if (m.qkv_bias()) add(g.qkv_width(), true);
    if (g.qk_norm) {
      norm(g.d);
      norm(g.d);
    }
    add(h * g.ctx_width(), true, true);
    if (m.add_bias_linear) add(h, false);
    norm(h);
    if (m.is_moe_layer(L.first_layer(pp_rank, chunk) + i)) {
      // The router's gate [E, h] (whole on every rank, read through its fp32 copy), each
      // expert's MLP, the shared expert's.
      add(g.E * h, false);
      for (int64_t e = 0; e < g.E; ++e) mlp(g.Fe);
      if (g.Fs > 0) mlp(g.Fs);
    } else {
      mlp(g.F);
    }
  }
  if (post) {
    norm(h);
    // An untied output layer, or the last stage's copy of a tied table (its own chunk only when
    // the embedding is elsewhere).
    if (m.untie_embeddings_and_output_weights || !pre) add(g.V / T * h, true, true);
  }
  if (sharded) *sharded = split;
  if (products_only) *products_only = product;
  return out;
}

std::vector<ChunkActivations> chunk_activations(const PlanInput& in, int pp_rank) {
  const Geometry g = geometry(in);
  std::vector<ChunkActivations> out;
  for (int c = 0; c < in.layout.vp; ++c) out.push_back(plan_chunk(in, g, pp_rank, c).act);
  return out;
}

MemoryPrediction predict_memory(const PlanInput& in) {
  const training::TrainingArgs& a = in.args;
  const Layout& l = in.layout;
  const Geometry g = geometry(in);
  const double value_bytes = double(dtype_size(a.model.params_dtype));
  const bool fp32 = a.model.params_dtype == DType::F32;
  const int dp_cp = l.dp * l.cp;
  const bool buffer = dp_cp > 1 || l.distributed_optimizer;
  const int moments = a.optimizer_name == "sgd" ? 1 : 2;
  MemoryPrediction pred;
  for (int r = 0; r < l.pp; ++r) {
    StageMemory st;
    st.pp_rank = r;
    std::vector<int64_t> numels;
    std::vector<ChunkPlan> chunks;
    // Initialisation draws each whole weight in fp32 and copies a sharded one's slice out of it.
    int64_t init_transient = 0;
    // Weights with an fp32 working copy: every one of a half-precision model, except those only
    // multiplied where the CPU's gemm computes in their dtype (bf16 with AVX-512: Weight::operand).
    const bool copies_skip_products =
        !fp32 && ops::gemm_computes_in(a.model.params_dtype, Device::cpu());
    int64_t copied = 0;
    for (int c = 0; c < l.vp; ++c) {
      std::vector<bool> split, product;
      const std::vector<int64_t> n = chunk_parameter_numels(in, r, c, &split, &product);
      numels.insert(numels.end(), n.begin(), n.end());
      for (size_t i = 0; i < n.size(); ++i)
        if (!(copies_skip_products && product[i])) copied += n[i];
      for (size_t i = 0; i < n.size(); ++i)
        init_transient = std::max(init_transient, split[i] && g.T > 1 ? n[i] * (g.T + 1) : n[i]);
      chunks.push_back(plan_chunk(in, g, r, c));
    }
    st.parameters = sum(numels);
    const double P = double(st.parameters);
    // The flat buffer (optim/grad_buffer.h): with --overlap-grad-reduce in buckets of
    // max(40M, 1M x DP x CP) elements by default, padded for the distributed optimizer.
    int64_t total = st.parameters, shard = 0, largest_bucket = 0;
    if (buffer) {
      const int64_t bucket = a.parallel.overlap_grad_reduce
                                 ? (a.parallel.ddp_bucket_size > 0
                                        ? a.parallel.ddp_bucket_size
                                        : std::max<int64_t>(40000000, 1000000 * int64_t(dp_cp)))
                                 : 0;
      const optim::BufferLayout layout =
          optim::BufferLayout::build(numels, bucket, dp_cp, l.distributed_optimizer);
      total = layout.total;
      if (l.distributed_optimizer) shard = layout.total_shard_size();
      for (const auto& b : layout.buckets)
        largest_bucket = std::max(largest_bucket, b.end - b.begin);
    }
    st.weights = (l.distributed_optimizer ? double(total) : P) * value_bytes;
    st.working_weights = fp32 ? 0 : 4.0 * double(copied);
    st.gradients = 4.0 * double(total);
    if (l.distributed_optimizer) {
      st.main_weights = 4.0 * double(shard);
      st.optimizer_moments = 4.0 * double(moments) * double(shard);
      st.comm_buffers += 4.0 * double(shard);  // the reduce-scattered gradient shard
    } else {
      st.main_weights = fp32 ? 0 : 4.0 * P;
      st.optimizer_moments = 4.0 * double(moments) * P;
    }
    if (a.bf16 && a.grad_reduce_in_bf16 && buffer)
      st.comm_buffers += 2.0 * double(total) + (l.distributed_optimizer ? 2.0 * double(shard) : 0);
    const int64_t Rh = g.R * g.h;
    if (l.pp > 1) st.comm_buffers += 4.0 * 4.0 * double(Rh);  // receives ahead, sends in flight
    for (const ChunkPlan& c : chunks)
      if (c.post) st.workspace_persistent = 4.0 * double(std::min(g.N, kHeadRows) * (g.V / g.T));
    st.inputs = double(in.num_microbatches) * double(g.N) * 16.0;
    // Walk the schedule: held activations before each pass plus the pass's own transient.
    const pipeline::Schedule sched =
        pipeline::make_schedule(l.pp, r, int(in.num_microbatches), l.vp, false);
    double held = 0, peak_pass = 0, peak_held = 0, peak_extra = 0;
    int in_flight = 0;
    for (const pipeline::Step& s : sched.steps) {
      const ChunkPlan& c = chunks[size_t(s.chunk)];
      const double act = c.act.total() - c.act.embedding;  // ids are the inputs' tensors
      const bool forward = s.pass == pipeline::Pass::Forward;
      const double before = held, extra = forward ? act + c.forward_extra : c.backward_extra;
      if (before + extra > peak_pass) {
        peak_pass = before + extra;
        peak_held = before;
        peak_extra = extra;
      }
      held += forward ? act : -act;
      in_flight += forward ? 1 : -1;
      st.max_in_flight = std::max(st.max_in_flight, in_flight);
    }
    double per_mb = 0;
    for (const ChunkPlan& c : chunks) per_mb += c.act.total() - c.act.embedding;
    st.activations_per_microbatch = per_mb;
    st.activations = peak_held;
    st.workspace = peak_extra;
    const double steady = st.static_bytes() + st.comm_buffers + st.workspace_persistent + st.inputs;
    st.peak = steady + peak_pass;
    st.data_indices = in.dataset_bytes;
    // Collectives after the backward, every bucket launched before any is waited for. Open MPI's
    // non-blocking all-reduce (ring) reduces into a buffer of its own (1/n of the message); its
    // non-blocking reduce-scatter (libnbc's only algorithm: a binomial reduction to one rank, then
    // a scatter) holds two copies of the whole message on every rank until it completes.
    const double grad_elem = a.bf16 && a.grad_reduce_in_bf16 ? 2.0 : 4.0;
    double collective = 0;
    if (dp_cp > 1)
      collective = l.distributed_optimizer ? 2.0 * grad_elem * double(total)
                                           : grad_elem * double(largest_bucket) / double(dp_cp);
    const int64_t partial = partial_grad_numel(in, chunks);
    if (g.T > 1 && partial > 0) {
      const double flat = 4.0 * double(partial);
      collective = std::max(collective, (flat >= kMmapThreshold ? flat : 0) + flat / double(g.T));
      st.peak = std::max(st.peak, steady + flat);
    }
    if (l.pp > 1 && !a.model.untie_embeddings_and_output_weights && (r == 0 || r == l.pp - 1))
      collective = std::max(collective, 4.0 * double(g.V / g.T * g.h) / 2.0);
    st.collective_extra = collective;
    double mapped = 0;
    for (const ChunkPlan& c : chunks) mapped += c.mapped_saved;
    mapped = std::min(peak_pass, mapped * double(st.max_in_flight) / double(chunks.size()));
    const double step_resident =
        st.peak + kHeapRetention * (peak_pass - mapped) + st.collective_extra;
    // Set-up: an fp32 model's old parameter storage lives on in its working views until the
    // first forward refreshes them after the distributed optimizer's buffer took the values over;
    // model construction holds values and gradients while it draws one whole weight.
    double setup = st.static_bytes() + st.comm_buffers;
    if (l.distributed_optimizer && fp32) setup += 4.0 * P;
    const double init = 4.0 * P + P * value_bytes + 4.0 * double(init_transient);
    st.peak = std::max({st.peak, setup, init});
    st.resident_overhead =
        std::max({step_resident, setup, init}) - st.peak + st.data_indices + kResidentBookkeeping;
    pred.stages.push_back(st);
  }
  for (size_t i = 0; i < pred.stages.size(); ++i)
    if (pred.stages[i].peak > pred.stages[size_t(pred.most_loaded)].peak) pred.most_loaded = int(i);
  return pred;
}

}  // namespace megatron::plan
