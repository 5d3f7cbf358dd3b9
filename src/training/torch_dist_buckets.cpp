// The distributed optimizer's dp_reshardable buckets read into model space; see
// torch_dist_buckets.h.
#include "training/torch_dist_buckets.h"

#include <algorithm>
#include <iterator>
#include <numeric>

#include "core/error.h"
#include "core/torch_file.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_buckets_family.h"
#include "training/torch_dist_buckets_moe.h"
#include "training/torch_dist_checkpoint.h"
#include "training/torch_dist_moe.h"

namespace megatron::training {

using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char* kPrefix = "optimizer.distributed.dp_group_idx_";
constexpr const char* kWordEmbedding = "embedding.word_embeddings.weight";
constexpr const char* kOutputLayer = "output_layer.weight";
constexpr int64_t kParamAlign = 64;  // _pad_start_of_param_if_needed

// One layer's parameters in Megatron-Core's registration order (TransformerLayer: input_layernorm,
// self_attention, pre_mlp_layernorm, mlp; SelfAttention: Attention's linear_proj before its own
// linear_qkv, then q/k layernorms; MLP: linear_fc1, linear_fc2; weight before bias).
const char* const kLayerOrder[] = {
    "input_layernorm.weight", "input_layernorm.bias",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "self_attention.q_layernorm.weight", "self_attention.q_layernorm.bias",
    "self_attention.k_layernorm.weight", "self_attention.k_layernorm.bias",
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};
// The same with Transformer Engine's modules: the layer's norms are fused into linear_qkv and
// linear_fc1 (TELayerNormColumnParallelLinear registers layer_norm_weight, layer_norm_bias, then
// weight, bias), so input_layernorm follows linear_proj and pre_mlp_layernorm opens the MLP.
const char* const kLayerOrderTe[] = {
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "input_layernorm.weight", "input_layernorm.bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "self_attention.q_layernorm.weight", "self_attention.q_layernorm.bias",
    "self_attention.k_layernorm.weight", "self_attention.k_layernorm.bias",
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};

int64_t numel_of(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>()); }
int64_t pad(int64_t x, int64_t d) { return (x + d - 1) / d * d; }

const Value* arg(const Value& ns, const char* name) { return ns.kind == Kind::Namespace ? ns.get(name) : nullptr; }

}  // namespace

std::vector<BufferBucket> megatron_buffer_layout(const std::function<std::optional<Shape>(const std::string&)>& local,
                                                 int p, int P, int64_t L, int64_t DP, bool tied, int64_t bucket_size,
                                                 std::set<std::string>* placed, bool transformer_engine,
                                                 int64_t experts, int v, int V) {
  std::vector<BufferSlot> order;  // named_parameters() order
  auto add = [&](const std::string& n) {
    if (std::optional<Shape> s = local(n)) {
      order.push_back({n, *s});
      if (placed != nullptr) placed->insert(n);
    }
  };
  MG_REQUIRE(V >= 1 && v >= 0 && v < V && L % (int64_t(P) * V) == 0, L, " layers do not split into ", P,
             " pipeline stages of ", V, " model chunks");
  const bool first = p == 0 && v == 0, last = p == P - 1 && v == V - 1;
  if (first) {
    add(kWordEmbedding);
    add("embedding.position_embeddings.weight");
  }
  const int64_t per = L / (int64_t(P) * V), l0 = (int64_t(v) * P + p) * per;
  for (int64_t l = l0; l < l0 + per; ++l) {
    for (const char* sub : transformer_engine ? kLayerOrderTe : kLayerOrder)
      add("decoder.layers." + std::to_string(l) + "." + sub);
    if (experts > 0) moe_layer_registration_order("decoder.layers." + std::to_string(l) + ".", experts, add);
  }
  if (last) {
    add("decoder.final_layernorm.weight");
    add("decoder.final_layernorm.bias");
    if (!tied) {
      add(kOutputLayer);
    } else if (P > 1) {
      const std::optional<Shape> s = local(kWordEmbedding);
      MG_REQUIRE(s.has_value(), "the tied word embedding's shape is unknown");
      order.push_back({kOutputLayer, *s, 0, true});
    }
  }
  return buckets_in_order(order, p, P, DP, tied, bucket_size);
}

std::vector<BufferBucket> buckets_in_order(const std::vector<BufferSlot>& order, int p, int P, int64_t DP, bool tied,
                                           int64_t bucket_size) {
  // The tied embedding of a pipelined run is Megatron's shared_embedding: a bucket of its own.
  auto shared = [&](const BufferSlot& e) {
    return tied && P > 1 && ((p == 0 && e.name == kWordEmbedding) || e.tied_copy);
  };
  // A bucket ends at `at`, padded to a multiple of lcm(DP, 128) (the padding is not saved).
  const int64_t divisor = std::lcm(DP, int64_t(128));
  std::vector<BufferBucket> buckets;
  BufferBucket cur;
  int64_t bucket_start = 0, start = 0, end = 0;
  auto close = [&](int64_t at) {
    cur.unpadded = at - bucket_start;
    cur.padded = pad(at, divisor) - bucket_start;
    buckets.push_back(std::move(cur));
    cur = BufferBucket();
    return pad(at, divisor);
  };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    start = pad(start, kParamAlign);
    if (shared(*it) && !cur.params.empty()) start = bucket_start = close(start);
    cur.params.push_back({it->name, it->local, start - bucket_start, it->tied_copy});
    end = start + numel_of(it->local);
    if ((bucket_size > 0 && end - bucket_start >= bucket_size) || shared(*it)) {
      start = bucket_start = close(end);
    } else {
      start = end;
    }
  }
  if (!cur.params.empty()) close(end);
  return buckets;
}

bool has_dp_reshardable_state(const DistcpFolder& f) {
  for (const std::string& prefix : {std::string(kPrefix), "chained_0." + std::string(kPrefix)})
    for (auto it = f.entries().lower_bound(prefix); it != f.entries().end() && it->first.starts_with(prefix); ++it)
      if (it->first.find(".bucket_idx_") != std::string::npos) return true;
  return false;
}

std::map<std::string, std::map<std::string, Tensor>> read_dp_reshardable_state(const CheckpointOnDisk& ckpt,
                                                                              const DistcpFolder& f) {
  const std::string label = f.metadata_label();
  const std::string how = ": save it with Megatron's --dist-ckpt-optim-fully-reshardable, or resume with "
                          "--no-load-optim (the weights load, the optimizer starts fresh)";
  const TorchFile common = TorchFile::open(ckpt.dir / "common.pt");
  const Value* ns = common.root().get("args");
  MG_REQUIRE(ns != nullptr && ns->kind == Kind::Namespace, common.label(), " has no args: the layout of the "
             "distributed optimizer's dp_reshardable buckets cannot be rebuilt", how);
  auto text = [&](const char* n) {
    const Value* v = arg(*ns, n);
    return v != nullptr && v->kind == Kind::Str ? v->text : std::string();
  };
  auto integer = [&](const char* n) {
    const Value* v = arg(*ns, n);
    return v != nullptr && v->kind == Kind::Int ? v->integer : int64_t(0);
  };
  auto flag = [&](const char* n) {
    const Value* v = arg(*ns, n);
    return v != nullptr && v->kind == Kind::Bool && v->boolean;
  };
  // Megatron-LM's default --transformer-impl is transformer_engine (args without it: that).
  const std::string impl = text("transformer_impl");
  MG_REQUIRE(impl.empty() || impl == "local" || impl == "transformer_engine", label,
             ": the distributed optimizer's dp_reshardable state of a --transformer-impl ", impl.substr(0, 40),
             " model (this build rebuilds the gradient-buffer order of Megatron-Core's local and Transformer "
             "Engine modules)", how);
  const bool te = impl != "local";
  const int V = int(std::max<int64_t>(1, integer("virtual_pipeline_model_parallel_size")));
  const int T = ckpt.parallel.tensor_model_parallel_size, P = ckpt.parallel.pipeline_model_parallel_size;
  const int64_t DP = std::max<int64_t>(1, integer("data_parallel_size"));
  const int64_t E = std::max<int64_t>(0, integer("num_experts"));
  const int64_t EP = E > 0 ? std::max<int64_t>(1, integer("expert_model_parallel_size")) : 1;
  const int64_t ETP = integer("expert_tensor_parallel_size");
  MG_REQUIRE(E == 0 || ETP == 0 || ETP == T, label, ": dp_reshardable state saved with "
             "--expert-tensor-parallel-size ", ETP, " other than --tensor-model-parallel-size ", T,
             " is not read by this build (it rebuilds the experts' buffers sharded as the dense ones)", how);
  MG_REQUIRE(E == 0 || !flag("moe_grouped_gemm") || te, label, ": dp_reshardable state of grouped experts "
             "with --transformer-impl local (Megatron-Core's legacy GroupedMLP, one weight1 / weight2 per "
             "layer) is not read by this build", how);
  MG_REQUIRE(E % EP == 0 && DP % EP == 0, label, ": ", E, " experts and ", DP, " data-parallel ranks do not "
             "split over ", EP, " expert-parallel ranks: the checkpoint's args are inconsistent", how);
  MG_REQUIRE(E == 0 || V == 1, label, ": dp_reshardable state of experts saved with virtual pipeline stages "
             "is not read by this build (it lays out the experts' buffers of one model chunk per stage)", how);
  const TrainingArgs a = training_args_from_json(ckpt.state.args);
  const int64_t L = a.model.num_layers;
  MG_REQUIRE(L % (int64_t(P) * V) == 0, label, ": ", L, " layers do not split over ", P, " pipeline stages of ",
             V, " model chunks: the checkpoint's args are inconsistent", how);
  MG_REQUIRE(V == 1 || a.model.family_id() == model::ModelFamilyId::gpt, label, ": dp_reshardable state of a ",
             a.model.family_id() == model::ModelFamilyId::bert ? "BERT" : "T5", " model saved with virtual "
             "pipeline stages is not read by this build", how);
  const bool tied = !a.model.untie_embeddings_and_output_weights;
  const BufferModel family{a.model.family_id(), L, a.model.decoder_layers(), tied, te, E};
  int64_t bucket_size = 0;  // none: DistributedDataParallel without --overlap-grad-reduce
  if (flag("overlap_grad_reduce"))
    bucket_size = integer("ddp_bucket_size") > 0 ? integer("ddp_bucket_size")
                                                  : std::max<int64_t>(40000000, 1000000 * DP);

  const std::map<std::string, Shape> shapes = torch_dist_model_shapes(ckpt);
  const std::map<std::string, model::WeightSpec> specs = checkpoint_weight_specs(ckpt, nlohmann::json());
  std::set<std::string> placed;
  // kind -> our name -> the shard of each TP rank
  std::map<std::string, std::map<std::string, std::vector<Tensor>>> shards;
  auto shard_shape = [&](const std::string& n) -> std::optional<Shape> {
    auto it = shapes.find(n);
    if (it == shapes.end() || torch_dist_moe::is_expert_bias(n)) return std::nullopt;
    Shape local = it->second;
    const int dim = specs.at(n).partition_dim;
    if (dim >= 0) {
      MG_REQUIRE(local[size_t(dim)] % T == 0, label, ": '", n, "' of shape ", shape_str(local),
                 " does not split over the checkpoint's ", T, " tensor-parallel ranks");
      local[size_t(dim)] /= T;
    }
    return local;
  };
  // The buckets of gradient buffer `gbuf` (model chunk; `buffers_expected` in all) of one
  // distributed optimizer of one model-parallel rank (`who`), saved under `g`
  // ("[chained_<i>.]optimizer.distributed.dp_group_idx_<n>."), the shards of TP rank t.
  auto read_rank = [&](const std::string& g, int gbuf, int buffers_expected, const std::vector<BufferBucket>& layout,
                       int t, const std::string& who) {
    // The saved buckets of this rank: "gbuf_idx_<i>.dtype_<d>.bucket_idx_<b>.<state>".
    std::map<int64_t, std::string> bucket_keys;  // b -> key without the state (buffer gbuf's)
    std::set<std::string> buffers;
    const std::string mine = "gbuf_idx_" + std::to_string(gbuf) + ".";
    for (auto it = f.entries().lower_bound(g); it != f.entries().end() && it->first.starts_with(g); ++it) {
      const std::string rest = it->first.substr(g.size());
      const size_t at = rest.find(".bucket_idx_");
      if (it->second.is_bytes || at == std::string::npos) continue;
      buffers.insert(rest.substr(0, at));
      const std::string tail = rest.substr(at + 12);
      const size_t dot = tail.find('.');
      MG_REQUIRE(dot != std::string::npos && dot > 0 && dot < 9 &&
                     std::all_of(tail.begin(), tail.begin() + long(dot), [](char c) { return c >= '0' && c <= '9'; }),
                 label, ": malformed bucket key '", it->first.substr(0, 160), "'");
      if (rest.starts_with(mine))
        bucket_keys[std::stoll(tail.substr(0, dot))] = g + rest.substr(0, at) + ".bucket_idx_" + tail.substr(0, dot);
    }
    MG_REQUIRE(!buffers.empty(), label, " has no dp_reshardable buckets '", g, "...' of ", who,
               ": the checkpoint is incomplete", how);
    // One buffer per model chunk, gbuf_idx_0 .. gbuf_idx_<chunks - 1>, each of one dtype pair.
    std::set<std::string> indices;
    for (const std::string& b : buffers) indices.insert(b.substr(0, b.find('.')));
    bool expected = int(indices.size()) == buffers_expected && int(buffers.size()) == buffers_expected;
    for (int i = 0; i < buffers_expected; ++i) expected = expected && indices.count("gbuf_idx_" + std::to_string(i));
    MG_REQUIRE(expected, label, ": ", who, " has ", buffers.size(), " gradient buffers (", buffers.begin()->substr(0, 80),
               ", ...) where its ", buffers_expected, " model chunk", buffers_expected > 1 ? "s make " : " makes ",
               buffers_expected, ": parameters of several dtypes, or another count of virtual pipeline stages, "
               "which this build does not lay out", how);
    MG_REQUIRE(bucket_keys.size() == layout.size() && !bucket_keys.empty() &&
                   bucket_keys.rbegin()->first == int64_t(layout.size()) - 1,
               label, ": ", who, " saved ", bucket_keys.size(), " buckets, but the model its args describe makes ",
               layout.size(), " (--overlap-grad-reduce ", bucket_size > 0 ? "on" : "off", ")", how);
    for (size_t b = 0; b < layout.size(); ++b) {
      const std::string& key = bucket_keys.at(int64_t(b));
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
        const std::string k = key + "." + kind;
        MG_REQUIRE(f.has(k), label, " has no '", k, "': the checkpoint is incomplete", how);
        const DistcpEntry& e = f.entry(k);
        MG_REQUIRE(e.size.size() == 1 && e.size[0] == layout[b].unpadded, label, ": '", k, "' holds ",
                   shape_str(e.size), " elements, but bucket ", b, " of the model the checkpoint's args describe "
                   "holds ", layout[b].unpadded, " (another model, parameter order or bucket size)", how);
        const Tensor flat = f.tensor(k).to(DType::F32);
        for (const BufferSlot& bp : layout[b].params) {
          if (bp.tied_copy) continue;  // equal to the first stage's
          std::vector<Tensor>& s = shards[kind][bp.name];
          s.resize(size_t(T));
          s[size_t(t)] = flat.narrow(0, bp.start, numel_of(bp.local)).contiguous().view(bp.local).clone();
        }
      }
    }
  };
  for (int p = 0; p < P; ++p) {
    // Under expert parallelism a stage with MoE layers has two optimizers (torch_dist_buckets_moe.h).
    const bool chained = stage_has_expert_buffer(a, p, P, int(EP));
    for (int t = 0; t < T; ++t) {
      for (int v = 0; v < V; ++v) {  // one gradient buffer per model chunk; bucketed: chunk 0 of stage 0
        const std::vector<BufferBucket> layout = model_buffer_layout(
            family,
            [&](const std::string& n) -> std::optional<Shape> {
              return chained && is_expert_param_name(n) ? std::nullopt : shard_shape(n);
            },
            p, P, DP, p == 0 && v == 0 ? bucket_size : 0, &placed, v, V);
        read_rank(dp_reshardable_prefix(chained, false, t + T * p), v, V, layout, t,
                  "model-parallel rank " + std::to_string(t + T * p) + " (tensor rank " + std::to_string(t) +
                      ", pipeline rank " + std::to_string(p) + (V > 1 ? ", model chunk " + std::to_string(v) : "") +
                      ")");
      }
      for (int64_t e = 0; chained && e < EP; ++e) {
        const std::vector<BufferBucket> experts = megatron_buffer_layout(
            [&](const std::string& n) -> std::optional<Shape> {
              const int x = expert_of_name(n);
              return x >= e * (E / EP) && x < (e + 1) * (E / EP) ? shard_shape(n) : std::nullopt;
            },
            p, P, L, DP / EP, false, p == 0 ? bucket_size : 0, &placed, te, E);
        read_rank(dp_reshardable_prefix(true, true, t + T * (e + EP * p)), 0, 1, experts, t,
                  "the experts' optimizer of tensor rank " + std::to_string(t) + ", expert-parallel rank " +
                      std::to_string(e) + ", pipeline rank " + std::to_string(p));
      }
    }
  }
  for (const auto& [name, shape] : shapes)
    MG_REQUIRE(placed.count(name) || torch_dist_moe::is_expert_bias(name), label, ": the model's tensor '", name, "' has no place this build knows in "
               "Megatron's gradient buffer", how);
  std::map<std::string, std::map<std::string, Tensor>> out;
  for (auto& [kind, by_name] : shards)
    for (auto& [name, s] : by_name) {
      const ShardRule rule = shard_rule(specs.at(name));
      Tensor full = merge_shards(rule.dim < 0 ? std::vector<Tensor>{s[0]} : s, rule);
      check_finite_tensor(full, "optimizer.state." + kind + "." + name, label);
      out[kind].emplace(name, std::move(full));
    }
  return out;
}

}  // namespace megatron::training
