// MPI communicator, and world_communicator(): MPI is initialised lazily, only when a world is
// requested under a launcher, so single-process binaries never need mpirun. MPI moves host
// memory: tensors on another device are staged through host copies (explicit copies), so
// collectives work on the checking device and on CUDA without CUDA-aware MPI.
//
// Every operation is issued non-blocking (MPI_I*) and waited by polling MPI_Testall against the
// group's deadline: blocking MPI calls cannot time out, and a dead or hung peer must make the
// survivors fail with a clear message (comm_timeout_abort -> MPI_Abort) instead of hanging.
// bf16/fp16 reductions run in fp32 on a temporary copy and are rounded back once on completion.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "kernels/ops.h"

#ifdef MEGATRON_HAVE_MPI
#include <mpi.h>
#endif

namespace megatron {

bool launched_under_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                          "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(var)) return true;
  }
  return false;
}

namespace {
std::string describe(const std::string& op, const std::string& group,
                     const std::vector<int>& ranks, int world_rank, double timeout) {
  std::string r;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) r += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) r += ",...";
  return str("distributed timeout: ", op, " on group '", group, "' (world ranks [", r,
             "]) did not complete within ", timeout, " s on world rank ", world_rank,
             ". A peer rank has probably died or hung: check the other ranks' output, or raise "
             "--distributed-timeout-minutes if the wait is expected.");
}
}  // namespace

#ifndef MEGATRON_HAVE_MPI

std::shared_ptr<Communicator> world_communicator(const CommOptions& options) {
  MG_REQUIRE(!launched_under_mpi(), "this build has no MPI support (configure with "
             "-DMEGATRON_MPI=ON) but the process was started by an MPI launcher");
  static std::shared_ptr<Communicator> world = make_self_communicator("world", options);
  return world;
}

[[noreturn]] void comm_timeout_abort(const Communicator& c, const std::string& op) {
  std::fprintf(stderr, "error: %s\n",
               describe(op, c.name(), c.world_ranks(), 0, c.timeout_seconds()).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void abort_job_if_distributed(int) {}
std::string rank_prefix() { return ""; }
bool load_mpi_runtime() { return false; }

#else

namespace {

int world_rank_or_zero() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  int r = 0;
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  MG_CHECK(false, "MPI call ", what, " failed: ", std::string(msg, size_t(len)));
}

// Finalizes MPI at exit if this process initialised it.
struct MpiRuntime {
  MpiRuntime() {
    // Open MPI's non-blocking all-reduce picks binomial/Rabenseifner by default, 4-10x slower
    // than its ring for 64K-1M floats on shared memory (bench/comm_bench.cpp); prefer the ring
    // unless the user chose an algorithm.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  }
  ~MpiRuntime() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::F16:
    case DType::BF16:
    case DType::U16: return MPI_UINT16_T;
    case DType::I8: return MPI_INT8_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::I16: return MPI_INT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }

// MPI reads and writes host memory: a tensor on another device (CUDA without CUDA-aware MPI, the
// checking device) is staged through a host copy, made with an explicit copy before the call
// (`load`) and copied back on completion.
Tensor host_side(const Tensor& t, bool load) {
  if (t.device().is_cpu()) return t;
  return load ? t.to(Device::cpu()) : Tensor::empty(t.shape(), t.dtype(), Device::cpu());
}

bool same_memory(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.byte_offset() == b.byte_offset();
}

// fp32 working copy of a contiguous host bf16/fp16 tensor (ops::cast rounds back with RNE).
Tensor to_f32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::F32);
  ops::cast(out, t);
  return out;
}

// One pending operation: its requests, the tensors it must keep alive, and what to do once done.
class MpiHandle final : public CommHandle::Impl {
 public:
  MpiHandle(std::string op, std::string group, std::vector<int> ranks, double timeout)
      : op_(std::move(op)), group_(std::move(group)), ranks_(std::move(ranks)), timeout_(timeout) {}
  ~MpiHandle() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!done_ && !fin) wait();
  }
  MPI_Request* request() { return &req_; }
  std::vector<Tensor> keep_alive;
  std::function<void()> on_complete;

  bool test() override {
    if (done_) return true;
    int flag = 0;
    mpi_check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), op_.c_str());
    if (flag) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                      std::chrono::duration<double>(timeout_));
    int polls = 0;
    while (!test()) {
      if (clock::now() > deadline) {
        std::fprintf(stderr, "error: %s\n",
                     describe(op_, group_, ranks_, world_rank_or_zero(), timeout_).c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
      }
      // Poll hot for latency, yielding so oversubscribed ranks share the cores; after a second
      // of waiting (a pipeline bubble, a slow or hung peer) sleep between polls to free the CPU.
      if (++polls < 64) continue;
      if (clock::now() - start < std::chrono::seconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

 private:
  void finish() {
    done_ = true;
    if (on_complete) on_complete();
    on_complete = nullptr;
    keep_alive.clear();
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::string op_, group_;
  std::vector<int> ranks_;
  double timeout_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options, bool owned)
      : comm_(comm), name_(std::move(name)), options_(options), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_group(comm_, &group);
    std::vector<int> local(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) local[size_t(i)] = i;
    world_ranks_.assign(size_t(size_), 0);
    MPI_Group_translate_ranks(group, size_, local.data(), world_group, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }
  ~MpiCommunicator() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (owned_ && !fin) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  double timeout_seconds() const override { return options_.timeout_seconds; }

  CommHandle all_reduce_async(Tensor& t, ReduceOp op) override {
    detail::check_tensor(*this, "all_reduce", t);
    auto h = handle(str("all_reduce(", reduce_op_name(op), ")"));
    const Tensor host = host_side(t, true);
    const Tensor buf = is_half(t.dtype()) ? to_f32(host) : host;
    finish_into(*h, t, host, buf);
    h->keep_alive = {t, host, buf};
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), count(buf), mpi_type(buf.dtype()),
                             mpi_op(op), comm_, h->request()), "MPI_Iallreduce");
    return CommHandle(h);
  }

  CommHandle all_gather_async(const Tensor& in, Tensor& out) override {
    detail::check_sizes(*this, "all_gather", in, out, in.numel(), in.numel() * size_);
    auto h = handle("all_gather");
    const Tensor hin = host_side(in, true), hout = host_side(out, false);
    finish_into(*h, out, hout, hout);
    h->keep_alive = {in, out, hin, hout};
    mpi_check(MPI_Iallgather(hin.raw_data(), count(hin), mpi_type(hin.dtype()), hout.raw_data(),
                             count(hin), mpi_type(hout.dtype()), comm_, h->request()),
              "MPI_Iallgather");
    return CommHandle(h);
  }

  CommHandle all_gather_inplace_async(Tensor& buf) override {
    detail::check_tensor(*this, "all_gather_inplace", buf);
    MG_CHECK(buf.numel() % size_ == 0, "all_gather_inplace on group '", name_, "' of size ", size_,
             ": ", buf.numel(), " elements do not split evenly");
    auto h = handle("all_gather_inplace");
    const Tensor host = host_side(buf, true);
    finish_into(*h, buf, host, host);
    h->keep_alive = {buf, host};
    const int n = count(host.view({-1}).narrow(0, 0, host.numel() / size_));
    mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host.raw_data(), n,
                             mpi_type(host.dtype()), comm_, h->request()),
              "MPI_Iallgather(in place)");
    return CommHandle(h);
  }

  CommHandle reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op) override {
    detail::check_sizes(*this, "reduce_scatter", in, out, out.numel() * size_, out.numel());
    auto h = handle(str("reduce_scatter(", reduce_op_name(op), ")"));
    const Tensor hin = host_side(in, true), hout = host_side(out, false);
    const bool half = is_half(in.dtype());
    const Tensor src = half ? to_f32(hin) : hin;
    const Tensor dst = half ? Tensor::empty(out.shape(), DType::F32) : hout;
    finish_into(*h, out, hout, dst);
    h->keep_alive = {in, out, hin, hout, src, dst};
    mpi_check(MPI_Ireduce_scatter_block(src.raw_data(), dst.raw_data(), count(dst),
                                        mpi_type(src.dtype()), mpi_op(op), comm_, h->request()),
              "MPI_Ireduce_scatter_block");
    return CommHandle(h);
  }

  CommHandle broadcast_async(Tensor& t, int root) override {
    detail::check_tensor(*this, "broadcast", t);
    MG_CHECK(root >= 0 && root < size_, "broadcast on group '", name_, "': root ", root,
             " outside [0, ", size_, ")");
    auto h = handle(str("broadcast(root ", root, ")"));
    const Tensor host = host_side(t, rank_ == root);
    finish_into(*h, t, host, host);
    h->keep_alive = {t, host};
    mpi_check(MPI_Ibcast(host.raw_data(), count(host), mpi_type(host.dtype()), root, comm_,
                         h->request()), "MPI_Ibcast");
    return CommHandle(h);
  }

  CommHandle send_async(const Tensor& t, int dst, int tag) override {
    detail::check_tensor(*this, "send", t);
    MG_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send on group '", name_, "': bad peer ", dst);
    auto h = handle(str("send(to ", dst, ", tag ", tag, ")"));
    const Tensor host = host_side(t, true);
    h->keep_alive = {t, host};
    mpi_check(MPI_Isend(host.raw_data(), count(host), mpi_type(host.dtype()), dst, tag, comm_,
                        h->request()), "MPI_Isend");
    return CommHandle(h);
  }

  CommHandle recv_async(Tensor& t, int src, int tag) override {
    detail::check_tensor(*this, "recv", t);
    MG_CHECK(src >= 0 && src < size_ && src != rank_, "recv on group '", name_, "': bad peer ", src);
    auto h = handle(str("recv(from ", src, ", tag ", tag, ")"));
    const Tensor host = host_side(t, false);
    finish_into(*h, t, host, host);
    h->keep_alive = {t, host};
    mpi_check(MPI_Irecv(host.raw_data(), count(host), mpi_type(host.dtype()), src, tag, comm_,
                        h->request()), "MPI_Irecv");
    return CommHandle(h);
  }

  CommHandle barrier_async() override {
    auto h = handle("barrier");
    mpi_check(MPI_Ibarrier(comm_, h->request()), "MPI_Ibarrier");
    return CommHandle(h);
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(sub, name, options_, true);
  }

 private:
  // MPI counts are int: larger buffers must be split by the caller (e.g. into buckets).
  int count(const Tensor& t) const {
    MG_CHECK(t.numel() <= int64_t(std::numeric_limits<int>::max()), "group '", name_,
             "': a buffer of ", t.numel(), " elements exceeds MPI's int count; split it");
    return int(t.numel());
  }
  // On completion: the fp32 work buffer rounded into the host tensor, the host tensor copied to
  // the result on its device (each step only where they differ).
  static void finish_into(MpiHandle& h, const Tensor& result, const Tensor& host,
                          const Tensor& work) {
    const bool round = !same_memory(work, host), stage = !same_memory(host, result);
    if (!round && !stage) return;
    h.on_complete = [result = Tensor(result), host, work, round, stage]() mutable {
      if (round) ops::cast(host, work);
      if (stage) result.copy_(host);
    };
  }
  std::shared_ptr<MpiHandle> handle(const std::string& op) {
    return std::make_shared<MpiHandle>(op, name_, world_ranks_, options_.timeout_seconds);
  }

  MPI_Comm comm_;
  std::string name_;
  CommOptions options_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
};

}  // namespace

namespace {
// MPI is initialised once per process, by whichever of the two callers comes first.
void init_mpi_once() { static MpiRuntime runtime; }
}  // namespace

bool load_mpi_runtime() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) init_mpi_once();
  return true;
}

std::shared_ptr<Communicator> world_communicator(const CommOptions& options) {
  static std::mutex mu;
  static std::shared_ptr<Communicator> world;
  std::lock_guard<std::mutex> lock(mu);
  if (!world) {
    if (launched_under_mpi()) {
      init_mpi_once();
      world = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, "world", options, false);
    } else {
      world = make_self_communicator("world", options);
    }
  }
  return world;
}

[[noreturn]] void comm_timeout_abort(const Communicator& c, const std::string& op) {
  std::fprintf(stderr, "error: %s\n",
               describe(op, c.name(), c.world_ranks(), world_rank_or_zero(), c.timeout_seconds())
                   .c_str());
  std::fflush(stderr);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

namespace {
int mpi_world_size_or_one() {
  int init = 0, fin = 0, n = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
}  // namespace

void abort_job_if_distributed(int exit_code) {
  if (mpi_world_size_or_one() <= 1) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

std::string rank_prefix() {
  return mpi_world_size_or_one() > 1 ? str("[rank ", world_rank_or_zero(), "] ") : std::string();
}

#endif

}  // namespace megatron
