// Communicator helpers and the group-of-one implementation (SelfCommunicator): every collective
// over a single rank is a copy (Tensor::copy_, so any device) or a no-op, so a world of 1 needs
// no MPI at all.
#include "comm/communicator.h"

#include <algorithm>
#include <cstring>

namespace megatron {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

namespace detail {

void check_tensor(const Communicator& c, const char* op, const Tensor& t) {
  MG_CHECK(t.defined(), op, " on group '", c.name(), "': undefined tensor");
  MG_CHECK(t.is_contiguous(), op, " on group '", c.name(), "': tensor must be contiguous");
}

void check_sizes(const Communicator& c, const char* op, const Tensor& in, const Tensor& out,
                 int64_t in_numel_expected, int64_t out_numel_expected) {
  check_tensor(c, op, in);
  check_tensor(c, op, out);
  MG_CHECK(in.device() == out.device(), op, " on group '", c.name(), "': input on ",
           in.device().to_string(), ", output on ", out.device().to_string());
  MG_CHECK(in.dtype() == out.dtype(), op, " on group '", c.name(), "': dtypes differ (",
           dtype_name(in.dtype()), " vs ", dtype_name(out.dtype()), ")");
  MG_CHECK(in.numel() == in_numel_expected && out.numel() == out_numel_expected, op,
           " on group '", c.name(), "' of size ", c.size(), ": input ", shape_str(in.shape()),
           " and output ", shape_str(out.shape()), " do not match");
}

void check_all_to_all_v(const Communicator& c, const Tensor& in,
                        const std::vector<int64_t>& send_counts, const Tensor& out,
                        const std::vector<int64_t>& recv_counts) {
  auto total = [&](const std::vector<int64_t>& counts, const char* which) {
    MG_CHECK(counts.size() == size_t(c.size()), "all_to_all_v on group '", c.name(), "' of size ",
             c.size(), ": ", counts.size(), " ", which, " counts");
    int64_t sum = 0;
    for (int64_t n : counts) {
      MG_CHECK(n >= 0, "all_to_all_v on group '", c.name(), "': negative ", which, " count ", n);
      sum += n;
    }
    return sum;
  };
  check_sizes(c, "all_to_all_v", in, out, total(send_counts, "send"), total(recv_counts, "receive"));
}

}  // namespace detail

CommHandle Communicator::all_to_all_async(const Tensor& in, Tensor& out) {
  detail::check_tensor(*this, "all_to_all", in);
  MG_CHECK(in.numel() % size() == 0, "all_to_all on group '", name(), "' of size ", size(), ": ",
           in.numel(), " elements do not split evenly");
  const std::vector<int64_t> counts(size_t(size()), in.numel() / size());
  return all_to_all_v_async(in, counts, out, counts);
}

CommHandle Communicator::all_gather_inplace_async(Tensor& buf) {
  detail::check_tensor(*this, "all_gather_inplace", buf);
  MG_CHECK(buf.numel() % size() == 0, "all_gather_inplace on group '", name(), "' of size ",
           size(), ": ", buf.numel(), " elements do not split evenly");
  const int64_t n = buf.numel() / size();
  // The input must not alias the output (MPI), and the copy stays alive with the handle.
  const Tensor mine = buf.view({-1}).narrow(0, int64_t(rank()) * n, n).clone();
  return all_gather_async(mine, buf);
}

namespace {

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator(std::string name, CommOptions options)
      : name_(std::move(name)), options_(options), ranks_{0} {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  double timeout_seconds() const override { return options_.timeout_seconds; }

  CommHandle all_reduce_async(Tensor& t, ReduceOp) override {
    detail::check_tensor(*this, "all_reduce", t);
    return {};
  }
  CommHandle all_gather_async(const Tensor& in, Tensor& out) override {
    detail::check_sizes(*this, "all_gather", in, out, in.numel(), in.numel());
    copy_bytes(in, out);
    return {};
  }
  CommHandle reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp) override {
    detail::check_sizes(*this, "reduce_scatter", in, out, out.numel(), out.numel());
    copy_bytes(in, out);
    return {};
  }
  CommHandle broadcast_async(Tensor& t, int root) override {
    detail::check_tensor(*this, "broadcast", t);
    MG_CHECK(root == 0, "broadcast on group '", name_, "' of size 1: root ", root);
    return {};
  }
  CommHandle all_to_all_v_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                                Tensor& out, const std::vector<int64_t>& recv_counts) override {
    detail::check_all_to_all_v(*this, in, send_counts, out, recv_counts);
    if (in.numel() > 0) copy_bytes(in, out);
    return {};
  }
  CommHandle send_async(const Tensor&, int dst, int) override {
    MG_CHECK(false, "send to rank ", dst, " on group '", name_, "' of size 1");
    return {};
  }
  CommHandle recv_async(Tensor&, int src, int) override {
    MG_CHECK(false, "recv from rank ", src, " on group '", name_, "' of size 1");
    return {};
  }
  CommHandle barrier_async() override { return {}; }

  std::shared_ptr<Communicator> split(int color, int, const std::string& name) override {
    if (color < 0) return nullptr;
    return std::make_shared<SelfCommunicator>(name, options_);
  }

 private:
  // out <- in (same element count, contiguous; any device: an explicit copy).
  static void copy_bytes(const Tensor& in, Tensor& out) {
    if (in.storage() == out.storage() && in.byte_offset() == out.byte_offset()) return;
    out.view({-1}).copy_(in.view({-1}));
  }
  std::string name_;
  CommOptions options_;
  std::vector<int> ranks_;
};

}  // namespace

std::vector<std::string> all_gather_strings(Communicator& c, const std::string& mine) {
  Tensor len = Tensor::full({1}, double(mine.size()), DType::I64);
  Tensor lens = Tensor::empty({c.size()}, DType::I64);
  c.all_gather(len, lens);
  int64_t longest = 0;
  for (int r = 0; r < c.size(); ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  Tensor buf = Tensor::zeros({std::max<int64_t>(longest, 1)}, DType::U8);
  std::memcpy(buf.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::empty({buf.numel() * c.size()}, DType::U8);
  c.all_gather(buf, all);
  std::vector<std::string> out;
  const char* p = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < c.size(); ++r)
    out.emplace_back(p + r * buf.numel(), size_t(lens.data<int64_t>()[r]));
  return out;
}

std::shared_ptr<Communicator> make_self_communicator(const std::string& name,
                                                     const CommOptions& options) {
  return std::make_shared<SelfCommunicator>(name, options);
}

}  // namespace megatron
