// The NCCL communicator (nccl_communicator.h). libnccl is opened with dlopen, so the binary runs
// (and runs on one GPU) where NCCL is not installed; every call into it is checked.
#include "comm/nccl_communicator.h"

#ifndef MEGATRON_HAVE_NCCL

namespace megatron {

bool nccl_compiled() { return false; }

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, Device) {
  MG_THROW("this build has no NCCL support (it needs the CUDA backend and nccl.h at configure "
           "time): device tensors cannot be reduced across ranks; use --device cpu");
}

}  // namespace megatron

#else

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/ops.h"

namespace megatron {

bool nccl_compiled() { return true; }

namespace {

// ---- libnccl, loaded at run time -----------------------------------------------------------
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    void* lib = nullptr;
    std::string why;
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (lib != nullptr) break;
      const char* e = dlerror();
      why += str(why.empty() ? "" : "; ", e ? e : name);
    }
    MG_REQUIRE(lib != nullptr, "NCCL could not be loaded (", why, "): a run with more than one "
               "GPU rank needs libnccl.so.2; install NCCL or add its folder to LD_LIBRARY_PATH "
               "(PyTorch's CUDA wheels ship it in site-packages/nvidia/nccl/lib)");
    auto sym = [lib](auto& fn, const char* name) {
      void* p = dlsym(lib, name);
      MG_REQUIRE(p != nullptr, "the loaded NCCL library lacks ", name, " (NCCL 2.12 or newer "
                 "is needed)");
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    NcclApi a;
    sym(a.get_version, "ncclGetVersion");
    sym(a.error_string, "ncclGetErrorString");
    sym(a.get_unique_id, "ncclGetUniqueId");
    sym(a.comm_init_rank, "ncclCommInitRank");
    sym(a.comm_destroy, "ncclCommDestroy");
    sym(a.comm_abort, "ncclCommAbort");
    sym(a.comm_async_error, "ncclCommGetAsyncError");
    sym(a.all_reduce, "ncclAllReduce");
    sym(a.all_gather, "ncclAllGather");
    sym(a.reduce_scatter, "ncclReduceScatter");
    sym(a.broadcast, "ncclBroadcast");
    sym(a.send, "ncclSend");
    sym(a.recv, "ncclRecv");
    sym(a.group_start, "ncclGroupStart");
    sym(a.group_end, "ncclGroupEnd");
    return a;
  }();
  return api;
}

#define MG_NCCL_CHECK(expr)                                                                     \
  do {                                                                                          \
    const ncclResult_t mg_nccl_ = (expr);                                                       \
    if (mg_nccl_ != ncclSuccess)                                                                \
      MG_THROW("NCCL error in ", #expr, " (", __FILE__, ":", __LINE__, "): ",                   \
               nccl().error_string(mg_nccl_));                                                  \
  } while (0)

#define MG_CUDART_CHECK(expr)                                                                   \
  do {                                                                                          \
    const cudaError_t mg_cu_ = (expr);                                                          \
    if (mg_cu_ != cudaSuccess)                                                                  \
      MG_THROW("CUDA error in ", #expr, " (", __FILE__, ":", __LINE__, "): ",                   \
               cudaGetErrorString(mg_cu_));                                                     \
  } while (0)

cudaStream_t compute_stream() { return static_cast<cudaStream_t>(cuda::stream_handle()); }

[[noreturn]] void abort_job(const std::string& message, ncclComm_t comm) {
  std::fprintf(stderr, "error: %s%s\n", rank_prefix().c_str(), message.c_str());
  std::fflush(stderr);
  if (comm != nullptr) nccl().comm_abort(comm);
  abort_job_if_distributed(1);
  std::_Exit(1);
}

// ---- one collective in flight, and the watchdog over all of them ----------------------------
struct Pending {
  cudaEvent_t done = nullptr;  // recorded on the communicator's stream after the collective
  std::chrono::steady_clock::time_point deadline;
  std::string what;  // "all_reduce(sum) on group 'dp' (world ranks [0,1]), timeout 600 s"
  ncclComm_t comm = nullptr;
  ~Pending() {
    if (done != nullptr) cudaEventDestroy(done);
  }
};

class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: its thread outlives main's statics
    return *w;
  }
  void watch(std::shared_ptr<Pending> p) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(p));
  }

 private:
  Watchdog() { std::thread([this] { loop(); }).detach(); }
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        Pending& p = **it;
        const cudaError_t q = cudaEventQuery(p.done);  // watched until done, waited or not
        if (q == cudaSuccess) {
          it = pending_.erase(it);
          continue;
        }
        if (q != cudaErrorNotReady)
          abort_job(str("CUDA error while waiting for ", p.what, ": ", cudaGetErrorString(q)),
                    p.comm);
        ncclResult_t async = ncclSuccess;
        if (nccl().comm_async_error(p.comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          abort_job(str("NCCL error in ", p.what, ": ", nccl().error_string(async),
                        ". A peer rank has probably failed: check the other ranks' output."),
                    p.comm);
        if (now > p.deadline)
          abort_job(str("distributed timeout: ", p.what, " did not complete. A peer rank has "
                        "probably died or hung: check the other ranks' output, or raise "
                        "--distributed-timeout-minutes if the wait is expected."),
                    p.comm);
        ++it;
      }
    }
  }
  std::mutex mu_;
  std::list<std::shared_ptr<Pending>> pending_;
};

class NcclHandle final : public CommHandle::Impl {
 public:
  explicit NcclHandle(std::shared_ptr<Pending> p) : pending_(std::move(p)) {}
  ~NcclHandle() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {  // a destructor must not throw; the watchdog reports a failed collective
      }
    }
  }
  std::vector<Tensor> keep_alive;
  std::function<void()> on_complete;  // enqueued on the backend's stream after the collective

  bool test() override {
    if (!done_ && cudaEventQuery(pending_->done) == cudaSuccess) finish();
    return done_;
  }
  // Orders the backend's stream after the collective (no host wait): every kernel enqueued from
  // now on sees its result, and the tensors it used may be reused.
  void wait() override {
    if (done_) return;
    MG_CUDART_CHECK(cudaStreamWaitEvent(compute_stream(), pending_->done, 0));
    finish();
  }

 private:
  void finish() {
    done_ = true;
    if (on_complete) on_complete();
    on_complete = nullptr;
    keep_alive.clear();
  }
  std::shared_ptr<Pending> pending_;
  bool done_ = false;
};

bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }

ncclDataType_t reduce_type(const std::string& group, DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::I8: return ncclInt8;
    case DType::U8: return ncclUint8;
    default: break;
  }
  MG_CHECK(false, "reduction of ", dtype_name(t), " tensors on group '", group,
           "' is not supported by the NCCL communicator");
  return ncclFloat32;
}

ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

Tensor to_f32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::F32, t.device());
  ops::cast(out, t);
  return out;
}

// ---- the communicator ------------------------------------------------------------------------
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> host, Device device)
      : host_(std::move(host)), device_(device) {
    MG_CHECK(device_.is_cuda(), "an NCCL communicator needs a CUDA device, got ",
             device_.to_string());
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (host_->rank() == 0) MG_NCCL_CHECK(nccl().get_unique_id(&id));
    Tensor bytes = Tensor::empty({int64_t(sizeof id)}, DType::U8, Device::cpu());
    std::memcpy(bytes.raw_data(), &id, sizeof id);
    host_->broadcast(bytes, 0);
    std::memcpy(&id, bytes.raw_data(), sizeof id);
    MG_NCCL_CHECK(nccl().comm_init_rank(&comm_, host_->size(), id, host_->rank()));
    MG_CUDART_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MG_CUDART_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  ~NcclCommunicator() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (comm_ != nullptr) nccl().comm_destroy(comm_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  const std::vector<int>& world_ranks() const override { return host_->world_ranks(); }
  double timeout_seconds() const override { return host_->timeout_seconds(); }

  CommHandle all_reduce_async(Tensor& t, ReduceOp op) override {
    if (!on_device(t)) return host_->all_reduce_async(t, op);
    detail::check_tensor(*this, "all_reduce", t);
    const std::string what = str("all_reduce(", reduce_op_name(op), ")");
    const Tensor buf = is_half(t.dtype()) ? to_f32(t) : t;
    auto h = launch(what, [&] {
      MG_NCCL_CHECK(nccl().all_reduce(buf.raw_data(), buf.raw_data(), size_t(buf.numel()),
                                      reduce_type(name(), buf.dtype()), reduce_op(op), comm_,
                                      stream_));
    });
    h->keep_alive = {t, buf};
    if (is_half(t.dtype())) h->on_complete = [t = Tensor(t), buf] { ops::cast(t, buf); };
    return CommHandle(h);
  }

  CommHandle all_gather_async(const Tensor& in, Tensor& out) override {
    if (!on_device(in)) return host_->all_gather_async(in, out);
    detail::check_sizes(*this, "all_gather", in, out, in.numel(), in.numel() * size());
    auto h = launch("all_gather", [&] {
      MG_NCCL_CHECK(nccl().all_gather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8,
                                      comm_, stream_));
    });
    h->keep_alive = {in, out};
    return CommHandle(h);
  }

  CommHandle all_gather_inplace_async(Tensor& buf) override {
    if (!on_device(buf)) return host_->all_gather_inplace_async(buf);
    detail::check_tensor(*this, "all_gather_inplace", buf);
    MG_CHECK(buf.numel() % size() == 0, "all_gather_inplace on group '", name(), "' of size ",
             size(), ": ", buf.numel(), " elements do not split evenly");
    const size_t slice = buf.nbytes() / size_t(size());
    auto h = launch("all_gather_inplace", [&] {
      char* base = static_cast<char*>(buf.raw_data());
      MG_NCCL_CHECK(nccl().all_gather(base + slice * size_t(rank()), base, slice, ncclUint8,
                                      comm_, stream_));
    });
    h->keep_alive = {buf};
    return CommHandle(h);
  }

  CommHandle reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op) override {
    if (!on_device(in)) return host_->reduce_scatter_async(in, out, op);
    detail::check_sizes(*this, "reduce_scatter", in, out, out.numel() * size(), out.numel());
    const bool half = is_half(in.dtype());
    const Tensor src = half ? to_f32(in) : in;
    const Tensor dst = half ? Tensor::empty(out.shape(), DType::F32, out.device()) : out;
    auto h = launch(str("reduce_scatter(", reduce_op_name(op), ")"), [&] {
      MG_NCCL_CHECK(nccl().reduce_scatter(src.raw_data(), dst.raw_data(), size_t(dst.numel()),
                                          reduce_type(name(), src.dtype()), reduce_op(op), comm_,
                                          stream_));
    });
    h->keep_alive = {in, out, src, dst};
    if (half) h->on_complete = [out = Tensor(out), dst] { ops::cast(out, dst); };
    return CommHandle(h);
  }

  CommHandle broadcast_async(Tensor& t, int root) override {
    if (!on_device(t)) return host_->broadcast_async(t, root);
    detail::check_tensor(*this, "broadcast", t);
    MG_CHECK(root >= 0 && root < size(), "broadcast on group '", name(), "': root ", root,
             " outside [0, ", size(), ")");
    auto h = launch(str("broadcast(root ", root, ")"), [&] {
      MG_NCCL_CHECK(nccl().broadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root,
                                     comm_, stream_));
    });
    h->keep_alive = {t};
    return CommHandle(h);
  }

  // NCCL has no all-to-all-v: one grouped send and receive per peer (as torch.distributed's
  // all_to_all_single does), skipping empty pieces.
  CommHandle all_to_all_v_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                                Tensor& out, const std::vector<int64_t>& recv_counts) override {
    if (!on_device(in)) return host_->all_to_all_v_async(in, send_counts, out, recv_counts);
    detail::check_all_to_all_v(*this, in, send_counts, out, recv_counts);
    const size_t elem = dtype_size(in.dtype());
    auto h = launch("all_to_all_v", [&] {
      const char* src = static_cast<const char*>(in.raw_data());
      char* dst = static_cast<char*>(out.raw_data());
      MG_NCCL_CHECK(nccl().group_start());
      size_t soff = 0, roff = 0;
      for (int r = 0; r < size(); ++r) {
        const size_t sn = size_t(send_counts[size_t(r)]) * elem;
        const size_t rn = size_t(recv_counts[size_t(r)]) * elem;
        if (sn > 0) MG_NCCL_CHECK(nccl().send(src + soff, sn, ncclUint8, r, comm_, stream_));
        if (rn > 0) MG_NCCL_CHECK(nccl().recv(dst + roff, rn, ncclUint8, r, comm_, stream_));
        soff += sn;
        roff += rn;
      }
      MG_NCCL_CHECK(nccl().group_end());
    });
    h->keep_alive = {in, out};
    return CommHandle(h);
  }

  // Point-to-point transfers and barriers: the host communicator's (MPI matches transfers by tag;
  // it stages device tensors through host copies).
  CommHandle send_async(const Tensor& t, int dst, int tag) override {
    return host_->send_async(t, dst, tag);
  }
  CommHandle recv_async(Tensor& t, int src, int tag) override {
    return host_->recv_async(t, src, tag);
  }
  CommHandle barrier_async() override { return host_->barrier_async(); }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::shared_ptr<Communicator> sub = host_->split(color, key, name);
    if (sub == nullptr) return nullptr;
    return std::make_shared<NcclCommunicator>(std::move(sub), device_);
  }

 private:
  bool on_device(const Tensor& t) const { return t.defined() && t.device().is_cuda(); }

  // Enqueues `issue` (the NCCL call) on this communicator's stream after the work already on the
  // backend's stream, and hands the collective to the watchdog.
  template <class Issue>
  std::shared_ptr<NcclHandle> launch(const std::string& op, Issue&& issue) {
    MG_CUDART_CHECK(cudaEventRecord(ready_, compute_stream()));
    MG_CUDART_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    issue();
    auto p = std::make_shared<Pending>();
    MG_CUDART_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    MG_CUDART_CHECK(cudaEventRecord(p->done, stream_));
    p->deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout_seconds()));
    std::string ranks;
    for (size_t i = 0; i < world_ranks().size() && i < 16; ++i)
      ranks += str(i ? "," : "", world_ranks()[i]);
    if (world_ranks().size() > 16) ranks += ",...";
    p->what = str(op, " on group '", name(), "' (world ranks [", ranks, "], NCCL), timeout ",
                  timeout_seconds(), " s");
    p->comm = comm_;
    Watchdog::get().watch(p);
    return std::make_shared<NcclHandle>(std::move(p));
  }

  std::shared_ptr<Communicator> host_;
  Device device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host,
                                                     Device device) {
  MG_CHECK(host != nullptr, "make_nccl_communicator: null host communicator");
  return std::make_shared<NcclCommunicator>(std::move(host), device);
}

}  // namespace megatron

#endif  // MEGATRON_HAVE_NCCL
