// The mixture-of-experts work of a training step outside the layers (see training_run.h):
// expert-bias updates, the logged auxiliary losses (track_moe_metrics), the data-parallel group
// of global_aux_loss and the expert biases in checkpoints.
#include <algorithm>

#include "model/language_module.h"
#include "training/training_run.h"

namespace megatron::training {

namespace {

std::vector<model::MoELayer*> moe_layers_of(TrainingRun& r) {
  std::vector<model::MoELayer*> layers;
  for (int k = 0; k < r.model->num_chunks(); ++k) {
    auto* lm = dynamic_cast<model::LanguageModule*>(&r.model->chunk(k));
    MG_CHECK(lm != nullptr, "moe layers: a model chunk is not a language model");
    for (model::MoELayer* m : lm->moe_layers()) layers.push_back(m);
  }
  return layers;
}

}  // namespace

std::vector<std::string> moe_metric_names(const model::TransformerConfig& c) {
  std::vector<std::string> names;
  if (c.num_moe_experts == 0) return names;
  const std::string lb =
      model::load_balancing_loss_name(model::load_balancing_of(c.moe_router_load_balancing_type));
  if (!lb.empty() && c.moe_aux_loss_coeff > 0) names.push_back(lb);
  if (c.moe_z_loss_coeff > 0) names.push_back("z_loss");
  return names;
}

void moe_step_begin(TrainingRun& r) {
  if (r.a.model.num_moe_experts == 0) return;
  Communicator* group = r.dp_cp > 1 ? &r.ps.dp_cp() : nullptr;
  for (model::MoELayer* m : moe_layers_of(r)) m->set_data_parallel_group(group);
}

MoeStepMetrics moe_step_metrics(TrainingRun& r, int64_t micro_batches) {
  const model::TransformerConfig& c = r.a.model;
  if (c.num_moe_experts == 0) return {};
  const std::vector<model::MoELayer*> layers = moe_layers_of(r);
  // One reduction over DP x CP: the tokens per expert of every layer of this pipeline stage, then
  // each layer's loss sums. Every rank of the group holds the same stage, so the same layers.
  const size_t E = size_t(c.num_moe_experts), L = layers.size();
  std::vector<double> v;
  for (model::MoELayer* m : layers) {
    const model::MoeStatistics st = m->take_statistics();
    v.insert(v.end(), st.tokens_per_expert.begin(), st.tokens_per_expert.end());
    v.push_back(st.load_balancing_loss);
    v.push_back(st.z_loss);
  }
  if (!v.empty()) v = r.dp_cp_sum(std::move(v));
  auto at = [&](size_t l) { return v.begin() + long(l * (E + 2)); };
  for (size_t l = 0; l < L; ++l)
    layers[l]->update_expert_bias(std::vector<double>(at(l), at(l) + long(E)));
  // track_moe_metrics: a layer's value is its sum over micro-batches / micro-batches; the
  // load-balancing losses are summed over the ranks that hold parts of the micro-batch (each
  // rank's value is its tokens' share: TP under sequence parallelism, CP) and averaged over DP;
  // global_load_balancing_loss's shares are summed over DP too (Megatron's
  // reduce_group_has_dp); the z-loss (each rank's mean over its tokens) is averaged over DP x CP.
  // Every layer has a slot (0 for a dense one or another stage's), the slots are summed over the
  // pipeline stages, and the logged value is their sum over the model's MoE layers.
  const std::vector<std::string> names = moe_metric_names(c);
  const size_t NL = size_t(c.num_layers);
  std::vector<double> slots(names.size() * NL, 0.0);
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string& n = names[k];
    const size_t at_k = n == "z_loss" ? E + 1 : E;
    const double ranks = n == "global_load_balancing_loss" ? 1.0
                         : n == "z_loss"                   ? double(r.dp_cp)
                                                           : double(r.dp());
    for (size_t l = 0; l < L; ++l)
      slots.at(k * NL + size_t(layers[l]->layer_number())) =
          at(l)[long(at_k)] / (double(micro_batches) * ranks);
  }
  // The tokens routed to each expert (summed over DP x CP, and TP under sequence parallelism),
  // per layer of the model (NL x E, zeros for a dense layer or another stage's), reduced over the
  // pipeline with the loss slots in one collective.
  const size_t loss_slots = slots.size();
  slots.resize(loss_slots + NL * E, 0.0);
  for (size_t l = 0; l < L; ++l)
    std::copy(at(l), at(l) + long(E), slots.begin() + long(loss_slots + size_t(layers[l]->layer_number()) * E));
  if (r.ps.pp_size() > 1) {
    Tensor t = Tensor::from_vector(slots, {int64_t(slots.size())});
    r.ps.pp().all_reduce(t, ReduceOp::Sum);
    slots.assign(t.data<double>(), t.data<double>() + t.numel());
  }
  int moe_layers = 0;
  for (int i = 0; i < c.num_layers; ++i) moe_layers += c.is_moe_layer(i) ? 1 : 0;
  MoeStepMetrics out;
  for (size_t k = 0; k < names.size(); ++k) {
    double sum = 0;
    for (size_t i = 0; i < NL; ++i) sum += slots[k * NL + i];
    out.logged.push_back(sum / double(std::max(moe_layers, 1)));
    if (r.a.moe_per_layer_logging)  // Megatron writes every layer's slot (0 for a dense one)
      for (size_t i = 0; i < NL; ++i)
        out.per_layer.emplace_back(str("moe/", names[k], "_layer_", i), slots[k * NL + i]);
  }
  out.tokens_per_expert.resize(NL);
  for (size_t i = 0; i < NL; ++i)
    if (c.is_moe_layer(int(i)))
      out.tokens_per_expert[i].assign(slots.begin() + long(loss_slots + i * E),
                                      slots.begin() + long(loss_slots + (i + 1) * E));
  return out;
}

model::ParameterList moe_checkpoint_buffers(TrainingRun& r) {
  model::ParameterList out;
  if (r.a.model.num_moe_experts == 0) return out;
  for (model::MoELayer* m : moe_layers_of(r))
    if (model::Parameter* p = m->expert_bias_state()) {
      m->sync_expert_bias_state();
      out.push_back(p);
    }
  return out;
}

void moe_checkpoint_buffers_loaded(TrainingRun& r) {
  if (r.a.model.num_moe_experts == 0) return;
  for (model::MoELayer* m : moe_layers_of(r)) m->load_expert_bias_state();
}

}  // namespace megatron::training
