// Mixture-of-experts keys of Megatron-LM's torch_dist checkpoints; see torch_dist_moe.h.
#include "training/torch_dist_moe.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "model/moe/moe_pattern.h"
#include "training/checkpoint_files.h"
#include "training/torch_checkpoint.h"

namespace megatron::training::torch_dist_moe {

namespace {

constexpr const char* kLayers = "decoder.layers.";
constexpr const char* kEncoderLayers = "encoder.layers.";  // BertModel's block (dense)
constexpr const char* kExperts = "mlp.experts.experts.";
constexpr const char* kLocal = "mlp.experts.local_experts.";
constexpr const char* kGrouped = "mlp.experts.";

// "decoder.layers.<N>.<rest>" -> N and rest; false for other names.
bool split_layer(const std::string& name, int* n, std::string* rest) {
  const std::string p = kLayers;
  if (!name.starts_with(p)) return false;
  size_t e = p.size();
  while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e])) && e - p.size() < 6) ++e;
  if (e == p.size() || e >= name.size() || name[e] != '.') return false;
  *n = std::stoi(name.substr(p.size(), e - p.size()));
  *rest = name.substr(e + 1);
  return true;
}

}  // namespace

bool fused_norm_keys(bool te, bool moe_layer, const std::string& sub) {
  // Under Transformer Engine the norms are parts of linear_qkv and linear_fc1, but an MoE layer's
  // pre-MLP norm is a TENorm of its own. Megatron-Core's local layer specs (gpt_layer_specs.py
  // get_gpt_layer_local_submodules, for dense and MoE layers alike; bert_layer_specs.py; t5_spec.py)
  // set sharded_state_dict_keys_map {input_layernorm. -> self_attention.linear_qkv.layer_norm_,
  // pre_mlp_layernorm. -> mlp.linear_fc1.layer_norm_}, which TransformerLayer.sharded_state_dict
  // applies to the sharded keys (not to state_dict names, so .pt files keep the module names).
  return !(te && moe_layer && sub.starts_with("pre_mlp_layernorm."));
}

namespace {

bool folded(const CheckpointRank& r) { return r.etp_size > 0 && r.etp_size != r.tp_size; }

// Megatron's expert tensor-parallel and expert data-parallel ranks of a folded run's rank: its
// place in the expert mesh (ETP x EP x expert DP x PP, parallel_state's order, which training
// uses) of its world rank.
std::pair<int, int> expert_mesh_ranks(const CheckpointRank& r) {
  ParallelConfig pc;
  pc.world_size = r.world != nullptr ? r.world->size() : 1;
  pc.tensor_model_parallel_size = r.tp_size;
  pc.pipeline_model_parallel_size = r.pp_size;
  pc.expert_model_parallel_size = r.ep_size;
  pc.expert_tensor_parallel_size = r.etp_size;
  const ParallelLayout l = ParallelLayout::build(pc);
  const int w = r.world != nullptr ? r.world->rank() : 0;
  MG_CHECK(l.rank_in(GroupKind::TP, w) == r.tp_rank && l.rank_in(GroupKind::PP, w) == r.pp_rank &&
               (r.ep_size == 1 || l.rank_in(GroupKind::EP, w) == r.ep_rank),
           "torch_dist: world rank ", w, "'s expert mesh does not match its tensor, pipeline and expert ranks");
  return {l.rank_in(GroupKind::EXPERT_TP, w), l.rank_in(GroupKind::EXPERT_DP, w)};
}

}  // namespace

std::pair<int, int> tensor_split(const CheckpointRank& rank, const std::string& ours) {
  if (folded(rank) && detail::is_expert_tensor_name(ours)) return {expert_mesh_ranks(rank).first, rank.etp_size};
  return {rank.tp_rank, rank.tp_size};
}

bool writes_experts(const CheckpointRank& rank) {
  return (folded(rank) ? expert_mesh_ranks(rank).second : rank.edp_rank) == 0;
}

int expert_tp_rank(const CheckpointRank& rank) {
  return folded(rank) ? expert_mesh_ranks(rank).first : rank.tp_rank;
}

bool is_expert_key(const std::string& key) { return key.find(std::string(".") + kExperts) != std::string::npos; }

void refuse_singleton_expert_key(const std::string& key, const std::string& label) {
  const size_t at = key.find(std::string(".") + kExperts);
  if (at == std::string::npos) return;
  const size_t after = at + 1 + std::string(kExperts).size();
  MG_REQUIRE(after >= key.size() || !std::isdigit(static_cast<unsigned char>(key[after])), label, ": '", key,
             "' is an expert weight under Megatron-Core's singleton_local_shards keys (one key per "
             "expert), which this build does not read: save the checkpoint without it (Megatron-LM's "
             "default), or as --ckpt-format torch");
}

std::pair<std::string, std::string> expert_names(int layer, const std::string& module_param, int e) {
  const std::string p = kLayers + std::to_string(layer) + ".";
  const std::string sequential = p + kLocal + std::to_string(e) + "." + module_param;
  return {sequential, p + kGrouped + module_param + std::to_string(e)};
}

bool is_expert_bias(const std::string& ours) { return ours.ends_with(".mlp.router.expert_bias"); }

MoeLayout moe_layout(const TrainingArgs& a) {
  MoeLayout m;
  m.experts = a.model.num_moe_experts;
  if (m.experts == 0) return m;
  const std::string& freq = a.model.moe_layer_freq;
  m.moe_layer = model::moe_layer_pattern(freq, int(a.model.num_layers));  // an Error when malformed
  // transformer_block.py: an int k > 1 or a list makes the layers non-homogeneous.
  int64_t k = 0;  // the integer form's value; a list (or an expression) stays 0
  if (freq.find_first_not_of("0123456789 ") == std::string::npos)
    for (char c : freq)
      if (c != ' ') k = std::min<int64_t>(k * 10 + (c - '0'), int64_t(1) << 40);
  m.per_layer_keys = k != 1;
  return m;
}

KeyPlace sharded_key(const std::string& ours, bool te, const MoeLayout& moe) {
  int n = -1;
  std::string rest;
  KeyPlace out;
  if (ours.starts_with(kEncoderLayers)) {  // stacked on a layer axis as the decoder's layers are
    const std::string name = torch_names::to_megatron(ours, 0, true);  // dense: fused_norm_keys
    const size_t at = std::string(kEncoderLayers).size(), dot = name.find('.', at);
    MG_REQUIRE(name.starts_with(kEncoderLayers) && dot != std::string::npos && dot > at, "tensor '", ours,
               "' is saved as '", name, "', not as a layer of Megatron's encoder block");
    out.key = kEncoderLayers + name.substr(dot + 1);
    out.layer = out.number = std::stoi(name.substr(at, dot - at));
    return out;
  }
  if (!split_layer(ours, &n, &rest)) {
    out.key = torch_names::to_megatron(ours, 0, te);
    return out;
  }
  const bool moe_layer = moe.experts > 0 && n < int(moe.moe_layer.size()) && moe.moe_layer[size_t(n)] == 1;
  const int e = torch_names::expert_number(ours);
  std::string sub;
  if (e >= 0) {
    // SequentialExperts': local_experts.<e>.<module>.<param>; GroupedExperts': <module>.<param><e>
    if (rest.starts_with(kLocal)) {
      sub = rest.substr(rest.find('.', std::string(kLocal).size()) + 1);
    } else {
      sub = rest.substr(std::string(kGrouped).size());
      while (!sub.empty() && std::isdigit(static_cast<unsigned char>(sub.back()))) sub.pop_back();
    }
    sub = kExperts + sub;
    out.expert = e;
  } else {
    const bool fused = fused_norm_keys(te, moe_layer, rest);
    const std::string name = torch_names::to_megatron(ours, 0, fused);
    sub = name.substr(name.find('.', std::string(kLayers).size()) + 1);
  }
  out.number = n;
  if (moe.per_layer_keys) {
    out.key = kLayers + std::to_string(n) + "." + sub;
  } else {
    out.key = kLayers + sub;
    out.layer = n;
  }
  return out;
}

void add_chunks_at(std::vector<torch_dist_io::WriteItem>& items, const std::string& key, const KeyPlace& place,
                   int L, int E, const Shape& global, int dim, std::vector<std::pair<int64_t, Tensor>> chunks) {
  if (place.expert < 0) {
    torch_dist_io::add_chunks(items, key, place.layer, L, global, dim, std::move(chunks));
    return;
  }
  Shape g = global;
  g.insert(g.begin(), E);
  for (auto& [at, data] : chunks) {
    Shape s = data.shape();
    s.insert(s.begin(), 1);
    data = data.contiguous().view(s);
  }
  const size_t first = items.size();
  torch_dist_io::add_chunks(items, key, place.layer, L, g, dim >= 0 ? dim + 1 : -1, std::move(chunks));
  for (size_t i = first; i < items.size(); ++i) items[i].offsets[place.layer >= 0 ? 1 : 0] = place.expert;
}

std::vector<std::string> layer_extra_state_keys(int layer, int L, bool te, const MoeLayout& moe, int first,
                                               int last, bool shared, const std::string& block) {
  // make_sharded_object_for_checkpoint: the object's offsets and shape are the prepended axes'
  // (layer, expert), or (0) of (1) without any.
  const bool per_layer = moe.per_layer_keys;
  auto shard = [&](int e) {
    if (e < 0) return per_layer ? std::string("0_1") : str(layer, "_", L);
    return per_layer ? str(e, "_", moe.experts) : str(layer, ".", e, "_", L, ".", moe.experts);
  };
  const bool moe_layer = moe.experts > 0 && moe.moe_layer.at(size_t(layer)) == 1;
  std::vector<std::string> out;
  for (const std::string& n : torch_names::extra_state_names(layer, te, block))
    if (!moe_layer || n.find(".mlp.") == std::string::npos) out.push_back(sharded_key(n, te, moe).key + "/shard_" + shard(-1));
  if (!moe_layer) return out;
  const std::string p = per_layer ? kLayers + std::to_string(layer) + "." : std::string(kLayers);
  for (int e = first; e < last; ++e)
    for (const char* m : {"linear_fc1", "linear_fc2"}) out.push_back(p + kExperts + m + "._extra_state/shard_" + shard(e));
  if (shared)
    for (const char* m : {"linear_fc1", "linear_fc2"})
      out.push_back(p + "mlp.shared_experts." + m + "._extra_state/shard_" + shard(-1));
  return out;
}

}  // namespace megatron::training::torch_dist_moe
