// Mixture-of-experts models in the dp_reshardable buckets; see torch_dist_buckets_moe.h.
#include "training/torch_dist_buckets_moe.h"

#include "training/torch_dist_moe.h"

namespace megatron::training {

namespace {

constexpr const char* kSequential = ".mlp.experts.local_experts.";
constexpr const char* kGrouped = ".mlp.experts.linear_fc";

// The digits at the end of `s` from `at` (-1: none, or not digits only).
int number_at(const std::string& s, size_t at) {
  if (at >= s.size() || s.size() - at > 9) return -1;
  int n = 0;
  for (size_t i = at; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return -1;
    n = n * 10 + (s[i] - '0');
  }
  return n;
}

}  // namespace

void moe_layer_registration_order(const std::string& prefix, int64_t experts,
                                  const std::function<void(const std::string&)>& add) {
  add(prefix + "mlp.router.weight");
  for (int64_t e = 0; e < experts; ++e)  // SequentialMLP: expert by expert
    for (const char* sub : {"linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"})
      add(prefix + "mlp.experts.local_experts." + std::to_string(e) + "." + sub);
  for (const char* fc : {"linear_fc1", "linear_fc2"})  // TEGroupedMLP: each grouped linear's weights
    for (int64_t e = 0; e < experts; ++e) add(prefix + "mlp.experts." + fc + ".weight" + std::to_string(e));
  for (const char* sub : {"linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias", "gate_weight"})
    add(prefix + "mlp.shared_experts." + sub);
}

int expert_of_name(const std::string& name) {
  size_t at = name.find(kSequential);
  if (at != std::string::npos) {
    at += std::string(kSequential).size();
    const size_t dot = name.find('.', at);
    return dot == std::string::npos ? -1 : number_at(name.substr(0, dot), at);
  }
  at = name.find(kGrouped);
  if (at == std::string::npos) return -1;
  const size_t w = name.find(".weight", at);
  return w == std::string::npos ? -1 : number_at(name, w + 7);
}

bool is_expert_param_name(const std::string& name) { return expert_of_name(name) >= 0; }

std::string dp_reshardable_prefix(bool chained, bool experts, int64_t group_idx) {
  return std::string(chained ? (experts ? "chained_1." : "chained_0.") : "") + "optimizer.distributed.dp_group_idx_" +
         std::to_string(group_idx) + ".";
}

bool stage_has_expert_buffer(const TrainingArgs& a, int p, int P, int ep_size) {
  if (a.model.num_moe_experts == 0 || ep_size <= 1) return false;
  const torch_dist_moe::MoeLayout moe = torch_dist_moe::moe_layout(a);
  const int64_t per = a.model.num_layers / P;
  for (int64_t l = p * per; l < (p + 1) * per && l < int64_t(moe.moe_layer.size()); ++l)
    if (moe.moe_layer[size_t(l)] == 1) return true;
  return false;
}

}  // namespace megatron::training
