// A Megatron-LM torch checkpoint merged into single-rank tensors (merge_checkpoint for the
// format), with its state in our metadata.json shape; see torch_checkpoint.h.
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {

using json = nlohmann::json;

namespace {

// What metadata.json would say about this checkpoint (files and partition dims aside).
json metadata_of(const CheckpointOnDisk& c, const std::string& optimizer_type) {
  CheckpointMetadata m;
  m.state = c.state;
  m.optimizer = optimizer_type.empty() ? json(nullptr)
                                       : json{{"type", optimizer_type}, {"distributed", false}};
  m.parallel = c.parallel;
  return json(checkpoint_metadata_to_json(m));
}

}  // namespace

TorchRankContents read_torch_rank_for(const CheckpointOnDisk& ckpt, const CheckpointRank& rank,
                                      bool with_optimizer, bool* resharded) {
  const int EP = ckpt.parallel.expert_model_parallel_size;
  *resharded = EP != rank.ep_size;
  if (!*resharded) return read_torch_rank(ckpt, rank.tp_rank, rank.pp_rank, with_optimizer, rank.ep_rank);
  // Another expert-parallel size: every EP folder of this TP x PP rank, by name (the dense
  // tensors are in each, equal; every expert in one).
  TorchRankContents out;
  bool optimizer_complete = with_optimizer;
  for (int e = 0; e < EP; ++e) {
    TorchRankContents r = read_torch_rank(ckpt, rank.tp_rank, rank.pp_rank, with_optimizer, e);
    for (auto& [name, t] : r.model.tensors) out.model.tensors.emplace(name, std::move(t));
    out.notes.insert(out.notes.end(), r.notes.begin(), r.notes.end());
    if (!r.optimizer) optimizer_complete = false;
    if (!optimizer_complete) continue;
    if (!out.optimizer) out.optimizer.emplace();
    for (auto& [name, t] : r.optimizer->tensors) {
      if (name == "optimizer.step") {
        auto it = out.optimizer->tensors.find(name);
        if (it != out.optimizer->tensors.end() && *it->second.data<int64_t>() >= *t.data<int64_t>()) continue;
        out.optimizer->tensors[name] = t;
        continue;
      }
      out.optimizer->tensors.emplace(name, std::move(t));
    }
  }
  if (!optimizer_complete) out.optimizer.reset();
  return out;
}

MergedCheckpoint merge_torch_checkpoint(const CheckpointOnDisk& ckpt, bool with_optimizer) {
  MergedCheckpoint m;
  m.source = ckpt;
  const int T = ckpt.parallel.tensor_model_parallel_size, P = ckpt.parallel.pipeline_model_parallel_size;
  const bool optim = with_optimizer && !ckpt.state.optimizer_type.empty();
  m.specs = checkpoint_weight_specs(ckpt, json());
  std::map<std::string, std::map<std::string, std::vector<Tensor>>> shards;  // name -> kind -> [t]
  std::map<std::string, int> stage_of;
  std::set<std::string> notes(ckpt.notes.begin(), ckpt.notes.end());
  bool optimizer_complete = optim;
  std::optional<int64_t> step;
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      CheckpointRank single;  // EP 1: every expert, from all of this TP x PP rank's EP folders
      single.tp_rank = t;
      single.pp_rank = p;
      bool resharded = false;
      TorchRankContents r = read_torch_rank_for(ckpt, single, optim, &resharded);
      notes.insert(r.notes.begin(), r.notes.end());
      for (auto& [name, tensor] : r.model.tensors) {
        auto [it, fresh] = stage_of.emplace(name, p);
        MG_REQUIRE(fresh || it->second == p, "tensor '", name, "' is in pipeline stages ", it->second,
                   " and ", p, " of ", ckpt.dir.string());
        auto& v = shards[name]["param"];
        MG_REQUIRE(int(v.size()) == t, ckpt.dir.string(), ": tensor '", name,
                   "' is missing from tensor-parallel rank ", v.size(), " of stage ", p);
        v.push_back(tensor);
      }
      if (!optimizer_complete) continue;
      if (!r.optimizer) {
        optimizer_complete = false;
        continue;
      }
      for (auto& [key, tensor] : r.optimizer->tensors) {
        if (key == "optimizer.step") {
          const int64_t s = *tensor.data<int64_t>();
          if (step && *step != s)
            notes.insert(str("the optimizer step differs between ranks (", *step, " and ", s,
                             "); the larger is kept"));
          step = std::max(step.value_or(0), s);
          continue;
        }
        const std::string rest = key.substr(std::string("optimizer.state.").size());
        const size_t dot = rest.find('.');
        shards[rest.substr(dot + 1)][rest.substr(0, dot)].push_back(tensor);
      }
    }
  }
  if (optim && !optimizer_complete) notes.insert("the optimizer state is not complete in every rank's "
                                                 "file: weights only");
  for (auto& [name, kinds] : shards) {
    // Optimizer state without a model tensor: the last stage's tied copy of the word embedding
    // (its state equals the embedding's; written again for a PP > 1 target).
    if (!kinds.count("param")) continue;
    auto spec = m.specs.find(name);
    MG_REQUIRE(spec != m.specs.end(), ckpt.dir.string(), ": tensor '", name, "' is not a "
               "parameter of the model the checkpoint's args describe");
    const ShardRule rule = shard_rule(spec->second);
    m.rules[name] = rule;
    for (auto& [kind, v] : kinds) {
      if (kind != "param" && !optimizer_complete) continue;
      MG_REQUIRE(int(v.size()) == T, ckpt.dir.string(), ": '", name, "' (", kind, ") is in ", v.size(),
                 " of ", T, " tensor-parallel ranks");
      Tensor full = merge_shards(v, rule);
      if (kind == "param")
        m.model[name] = full;
      else
        m.optimizer[kind][name] = full;
    }
  }
  if (optimizer_complete) {
    m.optimizer_type = ckpt.state.optimizer_type;
    m.optimizer_step = step.value_or(0);
  } else {
    m.optimizer.clear();
  }
  m.metadata = metadata_of(ckpt, m.optimizer_type);
  auto emb = m.model.find("embedding.word_embeddings.weight");
  MG_REQUIRE(emb != m.model.end(), ckpt.dir.string(), " has no word embedding in any stage (not a GPT "
             "checkpoint, or the first stage's files are missing)");
  m.padded_vocab_size = emb->second.size(0);
  m.notes.assign(notes.begin(), notes.end());
  return m;
}

}  // namespace megatron::training
