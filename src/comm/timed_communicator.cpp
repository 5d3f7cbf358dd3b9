// Timing decorator over any Communicator (see timed_communicator.h).
#include "comm/timed_communicator.h"

#include <algorithm>
#include <chrono>

namespace megatron {

namespace {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  explicit Stopwatch(CommStats& s) : s_(s), t0_(Clock::now()) {}
  ~Stopwatch() { s_.seconds += std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  CommStats& s_;
  Clock::time_point t0_;
};

class TimedHandle final : public CommHandle::Impl {
 public:
  TimedHandle(CommHandle inner, std::shared_ptr<CommStats> stats)
      : inner_(std::move(inner)), stats_(std::move(stats)) {}
  bool test() override {
    Stopwatch w(*stats_);
    return inner_.test();
  }
  void wait() override {
    Stopwatch w(*stats_);
    inner_.wait();
  }

 private:
  CommHandle inner_;
  std::shared_ptr<CommStats> stats_;
};

class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(std::shared_ptr<Communicator> inner, std::shared_ptr<CommStats> stats)
      : inner_(std::move(inner)), stats_(std::move(stats)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }
  double timeout_seconds() const override { return inner_->timeout_seconds(); }

  CommHandle all_reduce_async(Tensor& t, ReduceOp op) override {
    return timed(t, [&] { return inner_->all_reduce_async(t, op); });
  }
  CommHandle all_gather_async(const Tensor& in, Tensor& out) override {
    return timed(in, [&] { return inner_->all_gather_async(in, out); });
  }
  CommHandle all_gather_inplace_async(Tensor& buf) override {
    const int64_t n = buf.numel() / std::max(1, size());  // this rank's input: one slice
    return timed(buf.view({-1}).narrow(0, 0, n), [&] { return inner_->all_gather_inplace_async(buf); });
  }
  CommHandle reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op) override {
    return timed(in, [&] { return inner_->reduce_scatter_async(in, out, op); });
  }
  CommHandle broadcast_async(Tensor& t, int root) override {
    return timed(t, [&] { return inner_->broadcast_async(t, root); });
  }
  CommHandle all_to_all_v_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                                Tensor& out, const std::vector<int64_t>& recv_counts) override {
    return timed(in, [&] { return inner_->all_to_all_v_async(in, send_counts, out, recv_counts); });
  }
  CommHandle send_async(const Tensor& t, int dst, int tag) override {
    return timed(t, [&] { return inner_->send_async(t, dst, tag); });
  }
  CommHandle recv_async(Tensor& t, int src, int tag) override {
    return timed(t, [&] { return inner_->recv_async(t, src, tag); });
  }
  CommHandle barrier_async() override {
    return timed(Tensor(), [&] { return inner_->barrier_async(); });
  }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    auto sub = inner_->split(color, key, name);
    return sub ? std::make_shared<TimedCommunicator>(sub, stats_) : nullptr;
  }

 private:
  template <typename F>
  CommHandle timed(const Tensor& t, F&& launch) {
    Stopwatch w(*stats_);
    ++stats_->calls;
    if (t.defined()) stats_->bytes += int64_t(t.nbytes());
    return CommHandle(std::make_shared<TimedHandle>(launch(), stats_));
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<CommStats> stats_;
};

}  // namespace

std::shared_ptr<Communicator> make_timed_communicator(std::shared_ptr<Communicator> inner,
                                                      std::shared_ptr<CommStats> stats) {
  MG_CHECK(inner != nullptr && stats != nullptr, "make_timed_communicator: null argument");
  return std::make_shared<TimedCommunicator>(std::move(inner), std::move(stats));
}

}  // namespace megatron
