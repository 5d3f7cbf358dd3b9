// The simulated world of one rank (simulated_communicator.h).
#include "plan/simulated_communicator.h"

#include "core/error.h"

namespace megatron::plan {

namespace {

class SimulatedCommunicator final : public Communicator {
 public:
  // Group `members` (world ranks) of the layout, seen from world rank `world_rank`.
  SimulatedCommunicator(std::shared_ptr<const ParallelLayout> layout, int world_rank,
                        std::vector<int> members, std::string name)
      : layout_(std::move(layout)),
        world_rank_(world_rank),
        members_(std::move(members)),
        name_(std::move(name)) {
    for (size_t i = 0; i < members_.size(); ++i)
      if (members_[i] == world_rank_) rank_ = int(i);
  }

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return members_; }
  double timeout_seconds() const override { return 600.0; }

  CommHandle all_reduce_async(Tensor& t, ReduceOp) override {
    detail::check_tensor(*this, "all_reduce", t);
    return {};
  }
  CommHandle all_gather_async(const Tensor& in, Tensor& out) override {
    detail::check_sizes(*this, "all_gather", in, out, in.numel(), in.numel() * size());
    const Tensor flat = out.view({-1});
    for (int r = 0; r < size(); ++r)
      flat.narrow(0, int64_t(r) * in.numel(), in.numel()).copy_(in.view({-1}));
    return {};
  }
  CommHandle all_gather_inplace_async(Tensor& buf) override {  // in place, as MPI does
    detail::check_tensor(*this, "all_gather_inplace", buf);
    const int64_t n = buf.numel() / size();
    const Tensor flat = buf.view({-1}), mine = flat.narrow(0, int64_t(rank_) * n, n);
    for (int r = 0; r < size(); ++r)
      if (r != rank_) flat.narrow(0, int64_t(r) * n, n).copy_(mine);
    return {};
  }
  CommHandle reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp) override {
    detail::check_sizes(*this, "reduce_scatter", in, out, out.numel() * size(), out.numel());
    out.view({-1}).copy_(in.view({-1}).narrow(0, int64_t(rank_) * out.numel(), out.numel()));
    return {};
  }
  CommHandle broadcast_async(Tensor& t, int) override {
    detail::check_tensor(*this, "broadcast", t);
    return {};
  }
  CommHandle all_to_all_v_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                                Tensor& out, const std::vector<int64_t>& recv_counts) override {
    detail::check_all_to_all_v(*this, in, send_counts, out, recv_counts);
    out.zero_();
    return {};
  }
  CommHandle send_async(const Tensor& t, int, int) override {
    detail::check_tensor(*this, "send", t);
    return {};
  }
  CommHandle recv_async(Tensor& t, int, int) override {
    detail::check_tensor(*this, "recv", t);
    t.zero_();
    return {};
  }
  CommHandle barrier_async() override { return {}; }

  // The group of this rank that ParallelState asks for by its kind's name.
  std::shared_ptr<Communicator> split(int color, int, const std::string& name) override {
    if (color < 0) return nullptr;
    for (size_t k = 0; k < size_t(GroupKind::kCount); ++k)
      if (name == group_kind_name(GroupKind(k)))
        return std::make_shared<SimulatedCommunicator>(
            layout_, world_rank_, layout_->group_of(GroupKind(k), world_rank_), name);
    MG_CHECK(false, "simulated world: no group kind named '", name, "'");
    return nullptr;
  }

 private:
  std::shared_ptr<const ParallelLayout> layout_;
  int world_rank_ = 0, rank_ = 0;
  std::vector<int> members_;
  std::string name_;
};

}  // namespace

std::shared_ptr<Communicator> make_simulated_world(const ParallelConfig& config, int rank) {
  auto layout = std::make_shared<const ParallelLayout>(ParallelLayout::build(config));
  MG_CHECK(rank >= 0 && rank < config.world_size, "simulated world: rank ", rank, " of ",
           config.world_size);
  std::vector<int> all;
  for (int r = 0; r < config.world_size; ++r) all.push_back(r);
  return std::make_shared<SimulatedCommunicator>(layout, rank, all, "world");
}

}  // namespace megatron::plan
