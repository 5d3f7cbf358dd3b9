// Communicator: device-agnostic collectives over a group of ranks (a "process group").
// Implementations: SelfCommunicator (a group of one; no MPI needed) and MpiCommunicator
// (src/comm/mpi_communicator.cpp; tensors on a device other than the CPU are staged through host
// copies). A device implementation (NCCL) fills the same interface.
//
// Conventions (all ranks of the group call a collective in the same order with matching shapes):
// - Tensors are contiguous, on any device (the input and output of one call on the same one).
//   Collectives concatenate / split along the flat element order, which
//   for a contiguous tensor is dim 0 (callers permute for other dims; see tp_mappings.h).
// - all_gather: out.numel() == size() * in.numel(); rank r's input lands in slice r.
//   all_gather_inplace: buf.numel() is a multiple of size(); rank r's input is slice r of buf
//   itself (MPI_IN_PLACE), the other slices are overwritten with the other ranks' slices.
// - reduce_scatter: in.numel() == size() * out.numel(); rank r receives reduced slice r.
// - bf16/fp16 reductions are carried out in fp32 and rounded back once (RNE).
// - Every wait polls its requests against the group's timeout (--distributed-timeout-minutes);
//   on expiry the rank prints which group and operation hung and aborts the whole job, so a dead
//   or hung peer can never leave the others waiting forever.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace megatron {

enum class ReduceOp : uint8_t { Sum, Max, Min };
const char* reduce_op_name(ReduceOp op);

// A pending non-blocking operation. wait() blocks (with the group's timeout) until it completes
// and writes its result; a default-constructed handle is already complete. Handles are cheap to
// copy; waiting twice is harmless. Destroying an un-waited handle waits for it.
class CommHandle {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;  // true once complete (and finalized)
    virtual void wait() = 0;
  };
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait() {
    if (impl_) impl_->wait();
  }
  bool test() { return impl_ ? impl_->test() : true; }

 private:
  std::shared_ptr<Impl> impl_;
};

struct CommOptions {
  double timeout_seconds = 600.0;  // --distributed-timeout-minutes (default 10) * 60
  static CommOptions from_timeout_minutes(double minutes) {
    MG_REQUIRE(minutes > 0, "--distributed-timeout-minutes must be > 0, got ", minutes);
    return CommOptions{minutes * 60.0};
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;          // e.g. "world", "tp", "dp"
  virtual const std::vector<int>& world_ranks() const = 0;  // member i's rank in the world
  virtual double timeout_seconds() const = 0;

  // Non-blocking collectives. Inputs must stay alive and unmodified until the handle completes.
  virtual CommHandle all_reduce_async(Tensor& t, ReduceOp op) = 0;  // in place
  virtual CommHandle all_gather_async(const Tensor& in, Tensor& out) = 0;
  // The default copies slice rank() out and calls all_gather_async; MPI gathers in place.
  virtual CommHandle all_gather_inplace_async(Tensor& buf);
  virtual CommHandle reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  virtual CommHandle broadcast_async(Tensor& t, int root) = 0;  // root: rank in this group
  virtual CommHandle send_async(const Tensor& t, int dst, int tag = 0) = 0;
  virtual CommHandle recv_async(Tensor& t, int src, int tag = 0) = 0;
  virtual CommHandle barrier_async() = 0;

  // Blocking forms: start and wait.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op).wait(); }
  void all_gather(const Tensor& in, Tensor& out) { all_gather_async(in, out).wait(); }
  void all_gather_inplace(Tensor& buf) { all_gather_inplace_async(buf).wait(); }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op).wait();
  }
  void broadcast(Tensor& t, int root) { broadcast_async(t, root).wait(); }
  void send(const Tensor& t, int dst, int tag = 0) { send_async(t, dst, tag).wait(); }
  void recv(Tensor& t, int src, int tag = 0) { recv_async(t, src, tag).wait(); }
  void barrier() { barrier_async().wait(); }

  // Collective over this group: ranks passing the same color form a new group, ordered by key
  // (ties by current rank). color < 0: this rank joins no group and gets nullptr.
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
};

// A group of one: collectives are copies (reductions over one rank are the identity).
std::shared_ptr<Communicator> make_self_communicator(const std::string& name = "self",
                                                     const CommOptions& options = {});

// Every rank's string, in rank order (two all-gathers: lengths, then padded bytes). Collective.
std::vector<std::string> all_gather_strings(Communicator& c, const std::string& mine);

// If this process is one rank of a multi-rank MPI job, ends the whole job with `exit_code`
// (MPI_Abort: the launcher kills the other ranks, which would otherwise block in their next
// collective until the distributed timeout); returns otherwise. For fatal errors on one rank.
void abort_job_if_distributed(int exit_code);
// "[rank N] " when this process is one rank of a multi-rank MPI job, "" otherwise: a prefix for
// error messages, so the failing rank is named.
std::string rank_prefix();

// The world. Under a launcher (mpirun / srun) it initialises MPI on first call and returns the
// MPI world; otherwise (a plain single process) it returns a self communicator and never touches
// MPI. Later calls return the same world (options of the first call win).
std::shared_ptr<Communicator> world_communicator(const CommOptions& options = {});

// True when this process was started by an MPI launcher.
bool launched_under_mpi();

// Loads and initialises the MPI runtime in this process if the build has MPI and it is not loaded
// yet (a single-process MPI world), without changing what world_communicator() returns; false
// where the build has no MPI. For measuring what a rank of a multi-rank job holds (`plan`).
bool load_mpi_runtime();

namespace detail {
// Argument checks shared by implementations (InternalError on misuse: callers are library code).
void check_tensor(const Communicator& c, const char* op, const Tensor& t);
void check_sizes(const Communicator& c, const char* op, const Tensor& in, const Tensor& out,
                 int64_t in_numel_expected, int64_t out_numel_expected);
}  // namespace detail

// Prints "error: distributed timeout ..." to stderr and aborts the job (never returns).
[[noreturn]] void comm_timeout_abort(const Communicator& c, const std::string& op);

}  // namespace megatron
