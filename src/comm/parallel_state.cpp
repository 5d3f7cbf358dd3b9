// Rank-group arithmetic (Megatron's generate_masked_orthogonal_rank_groups) and the
// communicators of ParallelState, split from the world one group kind at a time.
#include "comm/parallel_state.h"

#include <algorithm>
#include <sstream>

namespace megatron {

namespace {

std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, '-')) out.push_back(tok);
  return out;
}

// index -> mixed-radix digits, first dimension fastest.
std::vector<int> decompose(int64_t index, const std::vector<int>& shape) {
  std::vector<int> idx(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    idx[i] = int(index % shape[i]);
    index /= shape[i];
  }
  return idx;
}

}  // namespace

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order,
                             int rank_offset)
    : rank_offset_(rank_offset) {
  const std::vector<std::pair<std::string, int>> dims = {
      {"tp", tp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}};
  std::string lowered = order;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), ::tolower);
  names_ = split_tokens(lowered);
  for (const auto& n : names_) {
    MG_REQUIRE(std::any_of(dims.begin(), dims.end(), [&](auto& d) { return d.first == n; }),
               "parallel order '", order, "': unknown dimension '", n,
               "' (use tp, cp, ep, dp, pp separated by '-')");
    MG_REQUIRE(std::count(names_.begin(), names_.end(), n) == 1, "parallel order '", order,
               "': dimension '", n, "' appears twice");
  }
  for (const auto& [n, size] : dims) {
    MG_REQUIRE(size >= 1, "parallel size of ", n, " must be >= 1, got ", size);
    if (std::find(names_.begin(), names_.end(), n) == names_.end()) {
      MG_REQUIRE(size == 1, "parallel order '", order, "' lacks '", n, "' but its size is ", size);
      names_.push_back(n);
    }
  }
  order_.clear();
  for (const auto& n : names_) {
    order_ += (order_.empty() ? "" : "-") + n;
    int size = 1;
    for (const auto& d : dims) if (d.first == n) size = d.second;
    sizes_.push_back(size);
    world_size_ *= size;
  }
}

RankGroups RankGenerator::get_ranks(const std::string& tokens) const {
  std::vector<bool> mask(names_.size(), false);
  for (const auto& t : split_tokens(tokens)) {
    auto it = std::find(names_.begin(), names_.end(), t);
    MG_CHECK(it != names_.end(), "get_ranks: unknown token '", t, "' in '", tokens, "'");
    mask[size_t(it - names_.begin())] = true;
  }
  std::vector<int> stride(names_.size());
  int s = 1;
  for (size_t i = 0; i < names_.size(); ++i) {
    stride[i] = s;
    s *= sizes_[i];
  }
  std::vector<int> mshape, mstride, ushape, ustride;
  for (size_t i = 0; i < names_.size(); ++i) {
    (mask[i] ? mshape : ushape).push_back(sizes_[i]);
    (mask[i] ? mstride : ustride).push_back(stride[i]);
  }
  int group_size = 1;
  for (int v : mshape) group_size *= v;
  const int num_groups = world_size_ / group_size;
  RankGroups out(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) {
    const auto gi = decompose(g, ushape);
    int base = rank_offset_;
    for (size_t i = 0; i < gi.size(); ++i) base += gi[i] * ustride[i];
    for (int r = 0; r < group_size; ++r) {
      const auto ri = decompose(r, mshape);
      int rank = base;
      for (size_t i = 0; i < ri.size(); ++i) rank += ri[i] * mstride[i];
      out[size_t(g)].push_back(rank);
    }
  }
  return out;
}

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::TP: return "tp";
    case GroupKind::PP: return "pp";
    case GroupKind::DP: return "dp";
    case GroupKind::CP: return "cp";
    case GroupKind::DP_CP: return "dp-cp";
    case GroupKind::MP: return "mp";
    case GroupKind::TP_CP: return "tp-cp";
    case GroupKind::TP_DP_CP: return "tp-dp-cp";
    case GroupKind::EMBEDDING: return "embd";
    case GroupKind::POSITION_EMBEDDING: return "pos-embd";
    case GroupKind::EP: return "ep";
    case GroupKind::EXPERT_TP: return "etp";
    case GroupKind::EXPERT_DP: return "edp";
    case GroupKind::TP_EP: return "tp-ep";
    case GroupKind::kCount: break;
  }
  return "?";
}

ParallelLayout ParallelLayout::build(const ParallelConfig& config) {
  ParallelLayout L;
  L.config = config;
  const int world = config.world_size;
  const int tp = config.tensor_model_parallel_size, pp = config.pipeline_model_parallel_size;
  const int cp = config.context_parallel_size, ep = config.expert_model_parallel_size;
  const int etp = config.expert_tensor_parallel_size > 0 ? config.expert_tensor_parallel_size : tp;
  L.config.expert_tensor_parallel_size = etp;
  MG_REQUIRE(world >= 1, "world size must be >= 1, got ", world);
  MG_REQUIRE(tp >= 1 && pp >= 1 && cp >= 1 && ep >= 1 && etp >= 1,
             "--tensor-model-parallel-size (", tp, "), --pipeline-model-parallel-size (", pp,
             "), --context-parallel-size (", cp, "), --expert-model-parallel-size (", ep,
             ") and --expert-tensor-parallel-size (", etp, ") must all be >= 1");
  MG_REQUIRE(world % (tp * pp * cp) == 0, "world size ", world,
             " is not divisible by --tensor-model-parallel-size (", tp,
             ") x --pipeline-model-parallel-size (", pp, ") x --context-parallel-size (", cp,
             "); change the parallel sizes or the number of processes");
  MG_REQUIRE(world % (etp * ep * pp) == 0, "world size ", world,
             " is not divisible by --expert-tensor-parallel-size (", etp,
             ") x --expert-model-parallel-size (", ep, ") x --pipeline-model-parallel-size (",
             pp, ")");
  L.data_parallel_size = world / (tp * pp * cp);
  L.expert_data_parallel_size = world / (etp * ep * pp);

  const RankGenerator dense(tp, 1, L.data_parallel_size, pp, cp, config.order);
  const RankGenerator expert(etp, ep, L.expert_data_parallel_size, pp, 1, config.order);
  auto set = [&](GroupKind k, RankGroups g) { L.groups[size_t(k)] = std::move(g); };
  set(GroupKind::TP, dense.get_ranks("tp"));
  set(GroupKind::PP, dense.get_ranks("pp"));
  set(GroupKind::DP, dense.get_ranks("dp"));
  set(GroupKind::CP, dense.get_ranks("cp"));
  set(GroupKind::DP_CP, dense.get_ranks("dp-cp"));
  set(GroupKind::MP, dense.get_ranks("tp-pp"));
  set(GroupKind::TP_CP, dense.get_ranks("tp-cp"));
  set(GroupKind::TP_DP_CP, dense.get_ranks("tp-dp-cp"));
  RankGroups embd, pos;
  for (const auto& g : L.all(GroupKind::PP)) {
    embd.push_back(g.size() > 1 ? std::vector<int>{g.front(), g.back()} : g);
    pos.push_back({g.front()});
  }
  set(GroupKind::EMBEDDING, embd);
  set(GroupKind::POSITION_EMBEDDING, pos);
  set(GroupKind::EP, expert.get_ranks("ep"));
  set(GroupKind::EXPERT_TP, expert.get_ranks("tp"));
  set(GroupKind::EXPERT_DP, expert.get_ranks("dp"));
  set(GroupKind::TP_EP, expert.get_ranks("tp-ep"));
  MG_REQUIRE(expert.get_ranks("pp") == L.all(GroupKind::PP), "parallel order '", config.order,
             "': the expert layout's pipeline groups differ from the dense layout's; put 'pp' "
             "last in the order");
  return L;
}

int ParallelLayout::group_index(GroupKind k, int rank) const {
  const auto& gs = all(k);
  for (size_t i = 0; i < gs.size(); ++i) {
    if (std::find(gs[i].begin(), gs[i].end(), rank) != gs[i].end()) return int(i);
  }
  return -1;
}

std::vector<int> ParallelLayout::group_of(GroupKind k, int rank) const {
  const int i = group_index(k, rank);
  return i < 0 ? std::vector<int>{} : all(k)[size_t(i)];
}

int ParallelLayout::rank_in(GroupKind k, int rank) const {
  const auto g = group_of(k, rank);
  auto it = std::find(g.begin(), g.end(), rank);
  return it == g.end() ? -1 : int(it - g.begin());
}

ParallelState ParallelState::create(const std::shared_ptr<Communicator>& world,
                                    ParallelConfig config) {
  MG_CHECK(world != nullptr, "ParallelState::create: no world communicator");
  config.world_size = world->size();
  ParallelState s;
  s.layout_ = ParallelLayout::build(config);
  s.world_ = world;
  s.world_rank_ = world->rank();
  const int r = s.world_rank_;
  s.coords_ = {s.layout_.rank_in(GroupKind::TP, r), s.layout_.rank_in(GroupKind::PP, r),
               s.layout_.rank_in(GroupKind::DP, r), s.layout_.rank_in(GroupKind::CP, r),
               s.layout_.rank_in(GroupKind::EP, r)};
  for (size_t k = 0; k < size_t(GroupKind::kCount); ++k) {
    const auto kind = GroupKind(k);
    const int color = s.layout_.group_index(kind, r);
    // Key = position in the group, so the communicator's ranks follow Megatron's group order.
    const int key = std::max(0, s.layout_.rank_in(kind, r));
    s.comms_[k] = world->split(color, key, group_kind_name(kind));
    MG_CHECK((color < 0) == (s.comms_[k] == nullptr), "split of group ", group_kind_name(kind));
  }
  return s;
}

Communicator& ParallelState::group(GroupKind k) const {
  MG_CHECK(comms_[size_t(k)] != nullptr, "world rank ", world_rank_, " is not a member of any '",
           group_kind_name(k), "' group");
  return *comms_[size_t(k)];
}

}  // namespace megatron
