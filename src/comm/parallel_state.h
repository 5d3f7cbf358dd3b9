// ParallelState: which ranks form the tensor-, pipeline-, data-, context- and expert-parallel
// groups, built from the world with Megatron's rank order (RankGenerator, order string
// "tp-cp-ep-dp-pp": leftmost = fastest-varying), so rank layouts match Megatron's.
//
// Two layers: RankGenerator / ParallelLayout are pure arithmetic (testable without MPI);
// ParallelState adds one Communicator per group kind for this rank. ParallelState is a value
// handed to every layer and optimizer that needs a group: there is no global parallel state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace megatron {

using RankGroups = std::vector<std::vector<int>>;

// Megatron's RankGenerator: sizes per dimension name and an order string over tp, cp, ep, dp, pp.
// Dimensions missing from the order must have size 1 (they are appended).
class RankGenerator {
 public:
  RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order, int rank_offset = 0);
  // All groups for a token set such as "tp", "dp-cp" or "tp-pp": ranks that differ only in those
  // coordinates. Groups in Megatron's order; ranks inside a group ascending along the order.
  RankGroups get_ranks(const std::string& tokens) const;
  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }

 private:
  std::vector<std::string> names_;  // in order, fastest first
  std::vector<int> sizes_;
  std::string order_;
  int world_size_ = 1;
  int rank_offset_ = 0;
};

struct ParallelConfig {
  int world_size = 1;
  int tensor_model_parallel_size = 1;    // --tensor-model-parallel-size
  int pipeline_model_parallel_size = 1;  // --pipeline-model-parallel-size
  int context_parallel_size = 1;         // --context-parallel-size
  int expert_model_parallel_size = 1;    // --expert-model-parallel-size
  int expert_tensor_parallel_size = 0;   // --expert-tensor-parallel-size (0: same as TP)
  std::string order = "tp-cp-ep-dp-pp";
};

// The group kinds ParallelState builds.
enum class GroupKind : uint8_t {
  TP, PP, DP, CP, DP_CP, MP, TP_CP, TP_DP_CP, EMBEDDING, POSITION_EMBEDDING,
  EP, EXPERT_TP, EXPERT_DP, TP_EP, kCount
};
const char* group_kind_name(GroupKind k);  // "tp", "pp", "dp", "cp", "dp-cp", "mp", ...

// Pure layout: every group of every kind, and this rank's coordinates.
struct ParallelLayout {
  ParallelConfig config;
  int data_parallel_size = 1;         // world / (tp * pp * cp)
  int expert_data_parallel_size = 1;  // world / (etp * ep * pp)
  RankGroups groups[size_t(GroupKind::kCount)];

  // Validates sizes (Error naming the flags on a mismatch) and computes all groups.
  static ParallelLayout build(const ParallelConfig& config);
  const RankGroups& all(GroupKind k) const { return groups[size_t(k)]; }
  // The group of kind k containing `rank` (empty if none, e.g. a middle PP stage has no
  // embedding group).
  std::vector<int> group_of(GroupKind k, int rank) const;
  // Index of that group among all(k), or -1.
  int group_index(GroupKind k, int rank) const;
  // This rank's position inside its group of kind k (-1 if not a member).
  int rank_in(GroupKind k, int rank) const;
};

// Coordinates of a rank.
struct ParallelCoords {
  int tp = 0, pp = 0, dp = 0, cp = 0, ep = 0;
};

class ParallelState {
 public:
  // Collective over `world`: builds the layout and splits one communicator per group kind.
  // Every rank of `world` must call it with the same config (world_size is taken from `world`).
  static ParallelState create(const std::shared_ptr<Communicator>& world, ParallelConfig config);

  const ParallelLayout& layout() const { return layout_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return layout_.config.world_size; }
  ParallelCoords coords() const { return coords_; }

  int tp_size() const { return layout_.config.tensor_model_parallel_size; }
  int pp_size() const { return layout_.config.pipeline_model_parallel_size; }
  int cp_size() const { return layout_.config.context_parallel_size; }
  int ep_size() const { return layout_.config.expert_model_parallel_size; }
  int dp_size() const { return layout_.data_parallel_size; }
  int tp_rank() const { return coords_.tp; }
  int pp_rank() const { return coords_.pp; }
  int dp_rank() const { return coords_.dp; }
  int cp_rank() const { return coords_.cp; }
  int ep_rank() const { return coords_.ep; }
  bool is_first_pp_stage() const { return coords_.pp == 0; }
  bool is_last_pp_stage() const { return coords_.pp == pp_size() - 1; }

  // The group of a kind; throws InternalError if this rank is not a member (embedding groups on
  // middle pipeline stages). has_group tells first.
  Communicator& group(GroupKind k) const;
  std::shared_ptr<Communicator> group_ptr(GroupKind k) const { return comms_[size_t(k)]; }
  bool has_group(GroupKind k) const { return comms_[size_t(k)] != nullptr; }
  Communicator& tp() const { return group(GroupKind::TP); }
  Communicator& pp() const { return group(GroupKind::PP); }
  Communicator& dp() const { return group(GroupKind::DP); }
  Communicator& cp() const { return group(GroupKind::CP); }
  Communicator& dp_cp() const { return group(GroupKind::DP_CP); }
  Communicator& mp() const { return group(GroupKind::MP); }
  Communicator& world() const { return *world_; }

 private:
  ParallelLayout layout_;
  int world_rank_ = 0;
  ParallelCoords coords_;
  std::shared_ptr<Communicator> world_;
  std::shared_ptr<Communicator> comms_[size_t(GroupKind::kCount)];
};

}  // namespace megatron
