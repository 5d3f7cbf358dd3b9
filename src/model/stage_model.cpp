// The model chunks of one pipeline rank and the gradient finalisation across them (see
// stage_model.h).
#include "model/stage_model.h"

#include "model/model_family.h"

#include <utility>

namespace megatron::model {

StageModel::StageModel(const TransformerConfig& cfg, uint64_t seed, const ParallelState& ps,
                       int layers_per_virtual_stage, Device device)
    : StageModel(cfg, seed,
                    PipelineLayout::make(cfg.num_layers, ps.pp_size(), layers_per_virtual_stage),
                    ps.pp_rank(), ps.group_ptr(GroupKind::TP), ps.group_ptr(GroupKind::PP),
                    ps.group_ptr(GroupKind::EMBEDDING), ps.group_ptr(GroupKind::CP), device,
                    ps.ep_size() > 1 ? ps.group_ptr(GroupKind::EP) : nullptr,
                    ps.layout().config.expert_tensor_parallel_size != ps.tp_size()
                        ? ps.group_ptr(GroupKind::EXPERT_TP)
                        : nullptr) {}

StageModel::StageModel(const TransformerConfig& cfg, uint64_t seed, const PipelineLayout& layout,
                             int pp_rank, std::shared_ptr<Communicator> tp_group,
                             std::shared_ptr<Communicator> pp_group,
                             std::shared_ptr<Communicator> embedding_group,
                             std::shared_ptr<Communicator> cp_group, Device device,
                             std::shared_ptr<Communicator> ep_group,
                             std::shared_ptr<Communicator> etp_group)
    : cfg_(cfg), layout_(layout), pp_rank_(pp_rank) {
  cfg.validate();
  MG_CHECK(tp_group != nullptr, "StageModel: null tensor-parallel group");
  cfg.validate_context_parallel(cp_group ? cp_group->size() : 1);
  cfg.validate_tensor_parallel(tp_group->size());
  MG_REQUIRE(cfg.num_layers == layout.num_layers, "StageModel: --num-layers ", cfg.num_layers,
             " does not match the pipeline layout's ", layout.num_layers);
  layout.validate();
  MG_CHECK(pp_rank >= 0 && pp_rank < layout.pipeline_size, "pipeline rank ", pp_rank,
           " outside [0, ", layout.pipeline_size, ")");
  if (!pp_group) {
    MG_CHECK(layout.pipeline_size == 1, "StageModel: no pipeline group for ",
             layout.pipeline_size, " stages");
    pp_group = make_self_communicator("pp");
  }
  MG_CHECK(pp_group->size() == layout.pipeline_size && pp_group->rank() == pp_rank,
           "StageModel: pipeline group of ", pp_group->size(), " (rank ", pp_group->rank(),
           ") does not match the layout's ", layout.pipeline_size, " stages (rank ", pp_rank, ")");
  pp_group_ = std::move(pp_group);
  embedding_group_ = std::move(embedding_group);
  if (layout.pipeline_size > 1 && (is_first_stage() || is_last_stage()))
    MG_CHECK(embedding_group_ && embedding_group_->size() == 2,
             "StageModel: the first and last pipeline stages need the embedding group");
  tp_ = TensorParallel::make(std::move(tp_group), cfg.sequence_parallel);
  if (ep_group && ep_group->size() > 1) tp_.expert_parallel = std::move(ep_group);
  tp_.expert_tensor_parallel = std::move(etp_group);
  ContextParallel cp = cp_group ? ContextParallel{std::move(cp_group)} : ContextParallel::none();
  cp.comm = parse_cp_comm_type(cfg.cp_comm_type);
  ModelOptions options;
  options.device = device;
  for (int c = 0; c < layout.num_chunks; ++c)
    chunks_.push_back(
        make_model_chunk(cfg, seed, tp_, cp, ChunkPlace{layout, pp_rank, c}, options));
  if (tp_.size() > 1)
    for (const Parameter* p : parameters()) partial_tp_grads_ = partial_tp_grads_ || p->sequence_parallel;
}
StageModel::~StageModel() = default;

void StageModel::set_forward_pre_hook(const ForwardPreHook& hook) {
  for (auto& c : chunks_) c->set_forward_pre_hook(hook);
}

ParameterList StageModel::parameters() {
  ParameterList out;
  for (auto& c : chunks_) {
    ParameterList p = c->parameters();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

void StageModel::all_reduce_sequence_parallel_grads() {
  if (partial_tp_grads_) model::all_reduce_sequence_parallel_grads(parameters(), tp_.comm());
}

Parameter* StageModel::shared_embedding() {
  if (layout_.pipeline_size == 1) return nullptr;
  if (is_first_stage()) return chunks_.front()->word_embedding();
  if (is_last_stage()) return chunks_.back()->word_embedding();
  return nullptr;
}

void StageModel::all_reduce_embedding_grads() {
  Parameter* p = shared_embedding();
  if (!p) return;
  embedding_group_->all_reduce(p->grad, ReduceOp::Sum);
}

void StageModel::sync_shared_embedding() {
  Parameter* p = shared_embedding();
  if (!p) return;
  embedding_group_->broadcast(p->value, 0);  // group rank 0 is the first stage
}

void StageModel::finalize_model_parallel_grads() {
  all_reduce_sequence_parallel_grads();
  all_reduce_embedding_grads();
}

}  // namespace megatron::model
