// Reading a rank's files of a checkpoint saved under expert parallelism (layout in checkpoint.h):
// one folder per TP x PP x EP rank, every folder holding the dense weights and its own experts
// under their global numbers. A rank of the same EP size reads its own folder; a rank of another
// EP size (or none: conversion, generation) reads every EP folder of its TP x PP rank and takes
// each tensor by name, so expert parallelism is resharded on load without a conversion step.
#include <algorithm>

#include "core/error.h"
#include "training/checkpoint.h"
#include "training/checkpoint_files.h"

namespace megatron::training::detail {

bool is_expert_tensor_name(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

std::vector<std::string> checkpoint_rank_dirs(const CheckpointOnDisk& ckpt, int tp_rank, int pp_rank) {
  const CheckpointParallel& c = ckpt.parallel;
  std::vector<std::string> out;
  for (int e = 0; e < c.expert_model_parallel_size; ++e)
    out.push_back(checkpoint_rank_dir(tp_rank, c.pipeline_model_parallel_size, pp_rank,
                                      c.expert_model_parallel_size, e));
  return out;
}

RankTensors read_rank_tensors(const CheckpointOnDisk& ckpt, const CheckpointRank& rank,
                              const std::string& file) {
  RankTensors out;
  const int ckpt_ep = ckpt.parallel.expert_model_parallel_size;
  if (ckpt_ep == rank.ep_size) {  // this rank's own folder
    const std::string rel = rank.rank_dir() + "/" + file;
    out.label = (ckpt.dir / rel).string();
    out.contents = read_tensor_file(ckpt, rel);
    return out;
  }
  // Another expert-parallel layout: the EP folders of this TP x PP rank that hold its experts,
  // merged by name (the dense tensors are in each of them, equal; each expert in one).
  out.resharded = true;
  const CheckpointParallel& c = ckpt.parallel;
  auto dir_of = [&](int t, int e) {
    return checkpoint_rank_dir(t, c.pipeline_model_parallel_size, rank.pp_rank, ckpt_ep, e);
  };
  out.label = (ckpt.dir / (ckpt_ep > 1 ? checkpoint_rank_dir(rank.tp_rank, rank.pp_size, rank.pp_rank, 1, 0) + "_*"
                                       : dir_of(rank.tp_rank, 0)) / file).string();
  const nlohmann::json& args = ckpt.state.args;
  const int64_t experts = args.contains("model") && args["model"].is_object()
                              ? args["model"].value("num_moe_experts", int64_t(0))
                              : 0;
  int first_ep = 0, last_ep = ckpt_ep;  // the checkpoint's EP ranks to read, [first_ep, last_ep)
  if (rank.ep_size > 1 && experts > 0 && experts % ckpt_ep == 0 && experts % rank.ep_size == 0) {
    // Experts [first, last) of this rank live in the folders of ckpt EP ranks first / per .. .
    const int64_t per_rank = experts / rank.ep_size, per_folder = experts / ckpt_ep;
    const int64_t first = rank.ep_rank * per_rank, last = first + per_rank;
    first_ep = int(first / per_folder);
    last_ep = int((last - 1) / per_folder + 1);
  }
  auto listed = [&](const std::string& rel) { return ckpt.files.is_object() && ckpt.files.contains(rel); };
  for (int e = first_ep; e < last_ep; ++e) {
    const std::string own = dir_of(rank.tp_rank, e) + "/" + file;
    std::string rel = own;
    bool experts_only = false;
    if (c.etp() != c.tensor_model_parallel_size && !listed(rel)) {
      // Parallel folding under EP: the world rank of TP rank t holds one EP rank, so the folder
      // of (t, e) may not exist; e's experts (expert-tensor shard t % ETP, whole at ETP 1) are in
      // the folder of another TP rank with the same shard.
      for (int t = rank.tp_rank % c.etp(); t < c.tensor_model_parallel_size && !listed(rel); t += c.etp())
        rel = dir_of(t, e) + "/" + file;
      experts_only = true;
    }
    MG_REQUIRE(listed(rel), (ckpt.dir / "metadata.json").string(), " lists no ", own,
               ": the checkpoint is ", c.describe(), " but that rank's file is missing from it");
    SafetensorsContents st = read_tensor_file(ckpt, rel);
    for (auto& [name, t] : st.tensors)
      if (!experts_only || is_expert_tensor_name(name)) out.contents.tensors.emplace(name, std::move(t));
    for (auto& [key, value] : st.metadata) out.contents.metadata.emplace(key, std::move(value));
  }
  return out;
}

std::vector<std::string> distributed_optimizer_files(const CheckpointOnDisk& ckpt,
                                                     const CheckpointRank& rank) {
  std::vector<std::string> out;
  for (const std::string& d : checkpoint_rank_dirs(ckpt, rank.tp_rank, rank.pp_rank)) {
    const std::string prefix = d + "/distrib_optim_dp_";
    for (const auto& [rel, entry] : ckpt.files.items())
      if (rel.starts_with(prefix) && rel.ends_with(".safetensors")) out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  const int want = ckpt.parallel.data_parallel_size;
  MG_REQUIRE(int(out.size()) == want, (ckpt.dir / "metadata.json").string(), " lists ", out.size(),
             " distributed-optimizer shard files of ", rank.rank_dir(), " (",
             ckpt.parallel.describe(), ") but the checkpoint was saved by ", want,
             " data-parallel ranks: a shard file is missing or from another checkpoint");
  return out;
}

}  // namespace megatron::training::detail
