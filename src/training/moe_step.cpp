// The mixture-of-experts work of a training step outside the layers (see training_run.h):
// expert-bias updates and the logged auxiliary losses.
#include <algorithm>

#include "model/language_module.h"
#include "training/training_run.h"

namespace megatron::training {

std::vector<std::string> moe_metric_names(const model::TransformerConfig& c) {
  std::vector<std::string> names;
  if (c.num_moe_experts == 0) return names;
  if (c.moe_router_load_balancing_type == "aux_loss" && c.moe_aux_loss_coeff > 0)
    names.push_back("load_balancing_loss");
  if (c.moe_z_loss_coeff > 0) names.push_back("z_loss");
  return names;
}

std::vector<double> moe_step_metrics(TrainingRun& r, int64_t micro_batches) {
  const model::TransformerConfig& c = r.a.model;
  if (c.num_moe_experts == 0) return {};
  std::vector<model::MoELayer*> layers;
  for (int k = 0; k < r.model->num_chunks(); ++k) {
    auto* lm = dynamic_cast<model::LanguageModule*>(&r.model->chunk(k));
    MG_CHECK(lm != nullptr, "moe_step_metrics: a model chunk is not a language model");
    for (model::MoELayer* m : lm->moe_layers()) layers.push_back(m);
  }
  // One reduction over DP x CP: the tokens per expert of every layer, then the loss sums.
  std::vector<double> v;
  std::vector<model::MoeStatistics> stats;
  double lb = 0, z = 0;
  for (model::MoELayer* m : layers) {
    stats.push_back(m->take_statistics());
    v.insert(v.end(), stats.back().tokens_per_expert.begin(), stats.back().tokens_per_expert.end());
    lb += stats.back().load_balancing_loss;
    z += stats.back().z_loss;
  }
  v.push_back(lb);
  v.push_back(z);
  v = r.dp_cp_sum(std::move(v));
  const size_t E = size_t(c.num_moe_experts);
  for (size_t l = 0; l < layers.size(); ++l)
    layers[l]->update_expert_bias(std::vector<double>(v.begin() + long(l * E),
                                                      v.begin() + long((l + 1) * E)));
  const double per = double(std::max<size_t>(layers.size(), 1)) * double(micro_batches) *
                     double(r.dp_cp);
  std::vector<double> out;
  for (const std::string& n : moe_metric_names(c))
    out.push_back((n == "z_loss" ? v[v.size() - 1] : v[v.size() - 2]) / per);
  return out;
}

}  // namespace megatron::training
