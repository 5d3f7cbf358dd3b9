// Megatron-LM's torch_dist checkpoints written without Python; see torch_dist_write.h.
#include "training/torch_dist_write.h"

#include <fstream>

#include "core/error.h"
#include "core/pickle.h"
#include "core/torch_file.h"
#include "model/model_settings.h"
#include "model/pipeline_layout.h"
#include "training/checkpoint_files.h"
#include "training/torch_dist_items.h"
#include "training/torch_dist_moe.h"
#include "training/torch_dist_t5.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Document;

using torch_dist_io::WriteItem;

fs::path write_torch_dist_checkpoint(const MergedCheckpoint& m, const fs::path& save_dir, int T, int P,
                                     const TorchSaveOptions& options, int layers_per_virtual_stage) {
  MG_REQUIRE(options.transformer_impl == "transformer_engine" || options.transformer_impl == "local",
             "--transformer-impl must be transformer_engine or local (got '", options.transformer_impl, "')");
  const bool te = options.transformer_impl == "transformer_engine";
  const json& meta = m.metadata;
  const TrainingArgs a = training_args_from_json(meta.at("args"));
  const bool t5 = a.model.family_id() == model::ModelFamilyId::t5;
  const torch_dist_moe::MoeLayout moe = torch_dist_moe::moe_layout(a);
  const int L = int(a.model.num_layers);
  MG_REQUIRE(!t5 || P == 1, "--save-format torch_dist writes T5 models of one pipeline stage "
             "(--target-pipeline-parallel-size 1; got ", P, ")");
  MG_REQUIRE(L % P == 0, "--target-pipeline-parallel-size ", P, " does not divide the ", L, " layers");
  const int EP = options.expert_model_parallel_size;
  MG_REQUIRE(EP >= 1 && (EP == 1 || (moe.experts > 0 && moe.experts % EP == 0)),
             "--target-expert-model-parallel-size ", EP, ": the checkpoint's model has ", moe.experts,
             " experts per MoE layer, not a positive multiple of ", EP);
  MG_REQUIRE(!t5 || layers_per_virtual_stage == 0, "--save-format torch_dist writes T5 models without virtual "
             "pipeline stages: leave out --target-num-layers-per-virtual-pipeline-stage");
  const int V = model::PipelineLayout::make(L, P, layers_per_virtual_stage).num_chunks;  // an Error when uneven
  const int64_t iteration = meta.at("iteration").get<int64_t>();
  const std::string dir_name = m.source.release ? "release" : iteration_dir_name(iteration);
  const bool optim = !m.optimizer_type.empty();
  const bool adam = m.optimizer_type == "adam";

  const fs::path tmp = save_dir / (".tmp_" + dir_name);
  detail::create_private_dirs(save_dir);
  fs::remove_all(tmp);
  detail::create_private_dirs(tmp);

  // The states written per tensor: the weights, then the optimizer's in model space.
  std::vector<std::pair<std::string, std::function<Tensor(const std::string&)>>> states = {
      {"", [&](const std::string& n) { return m.model.at(n); }}};
  if (optim) {
    states.emplace_back("optimizer.state.param.", [&](const std::string& n) {
      auto fp32 = m.optimizer.find("fp32_param");
      return fp32 != m.optimizer.end() && fp32->second.count(n) ? fp32->second.at(n) : m.model.at(n).to(DType::F32);
    });
    for (const char* k : adam ? std::vector<const char*>{"exp_avg", "exp_avg_sq"}
                              : std::vector<const char*>{"momentum_buffer"})
      states.emplace_back(std::string("optimizer.state.") + k + ".",
                          [&m, k](const std::string& n) { return m.optimizer.at(k).at(n); });
  }

  std::vector<torch_dist_io::ItemRecord> records;
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) {
      std::vector<WriteItem> items;
      for (const auto& [prefix, get] : states)
        for (const auto& [name, full] : m.model) {
          const torch_dist_moe::KeyPlace place = torch_dist_moe::sharded_key(name, te, moe);
          const int stage = t5 ? 0  // one stage
                        : place.number >= 0 ? place.number / (L / P) : name.starts_with("embedding.") ? 0 : P - 1;
          if (stage != p) continue;
          const ShardRule& rule = m.rules.at(name);
          const Tensor value = get(name);
          if (!t5) {
            torch_dist_moe::add_chunks_at(items, prefix + place.key, place, L, moe.experts, value.shape(), rule.dim,
                                          torch_dist_io::tp_chunks(value, rule, t, T, name));
            continue;
          }
          for (const std::string& key : torch_dist_t5::keys_of(name, place.key, !prefix.empty()))
            torch_dist_moe::add_chunks_at(items, prefix + key, place, int(torch_dist_t5::block_layers(key, a)), 0,
                                          value.shape(), rule.dim, torch_dist_io::tp_chunks(value, rule, t, T, name));
        }
      add_object_items(items, tmp, a, meta, t, T, p, P, 0, 1, te);
      std::vector<torch_dist_io::ItemRecord> r = torch_dist_io::write_rank_files(tmp, t + T * p, items);
      records.insert(records.end(), r.begin(), r.end());
    }
  torch_dist_io::write_dcp_metadata(tmp, records, (save_dir / dir_name).string());
  torch_dist_io::CommonState c;
  c.meta = meta;
  c.tp = T;
  c.pp = P;
  c.vp = V;
  c.ep = EP;
  c.dp = EP;  // a run at EP with the experts split over TP: DP x TP a multiple of EP x TP
  c.dtype = m.model.at("embedding.word_embeddings.weight").dtype();
  c.padded_vocab_size = m.padded_vocab_size;
  c.transformer_impl = options.transformer_impl;
  if (optim) c.optimizer_form = "fully_reshardable";
  c.optimizer_type = m.optimizer_type;
  c.optimizer_step = m.optimizer_step;
  torch_dist_io::write_common_files(tmp, c);
  detail::fsync_path(tmp, true);
  detail::publish_iteration(save_dir, tmp, dir_name, m.source.release ? std::string("release")
                                                                       : std::to_string(iteration));
  return save_dir / dir_name;
}

void add_object_items(std::vector<torch_dist_io::WriteItem>& items, const fs::path& tmp, const TrainingArgs& a,
                      const json& meta, int t, int T, int p, int P, int d, int DP, bool te, int edp, int ep, int EP,
                      int et) {
  const int L = int(a.model.num_layers);
  auto none_list = [](Document& doc) { return doc.list({doc.none()}); };
  const torch_dist_moe::MoeLayout moe = torch_dist_moe::moe_layout(a);
  const int per_ep = moe.experts / std::max(EP, 1);
  if (a.model.family_id() == model::ModelFamilyId::t5) {  // one stage
    if (t == 0 && d == 0)
      for (const std::string& key : torch_dist_t5::extra_state_keys(a, te))
        items.push_back(torch_dist_io::object_item(key, none_list, tmp));
  } else if ((t == 0 && d == 0) || ((et < 0 ? t : et) == 0 && edp == 0)) {  // each layer module's _extra_state
    for (int layer = p * (L / P); layer < (p + 1) * (L / P); ++layer)
      for (const std::string& key : torch_dist_moe::layer_extra_state_keys(
               layer, L, te, moe, ep * per_ep, (ep + 1) * per_ep, a.model.moe_shared_expert_intermediate_size > 0,
               a.model.family_id() == model::ModelFamilyId::bert ? "encoder" : "decoder"))
        if (torch_dist_moe::is_expert_key(key) ? (et < 0 ? t : et) == 0 && edp == 0 : t == 0 && d == 0)
          items.push_back(torch_dist_io::object_item(key, none_list, tmp));
    if (p == P - 1 && t == 0 && d == 0)
      items.push_back(torch_dist_io::object_item("output_layer._extra_state/shard_0_1", none_list, tmp));
  }
  if (meta.value("rng_state", json()).is_null()) return;
  const json& rng = meta.at("rng_state");
  const std::string key = DP > 1 ? str("rng_state/shard_", p, ".", t, ".", d, "_", P, ".", T, ".", DP)
                                 : str("rng_state/shard_", p, ".", t, "_", P, ".", T);
  items.push_back(torch_dist_io::object_item(key, [&](Document& doc) {
    return torch_rng::megatron_rng_state(doc, a.seed, t, p, rng.at("seed").get<uint64_t>(),
                                         rng.at("dropout_offset").get<uint64_t>());
  }, tmp));
}

}  // namespace megatron::training
