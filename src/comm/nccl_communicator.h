// NCCL for device tensors: a Communicator over a group whose collectives on CUDA tensors run
// through NCCL (all-reduce, all-gather, reduce-scatter, broadcast), and everything else through
// the host communicator it wraps (host tensors; point-to-point transfers and barriers, which MPI
// orders by tag, the device tensors of a transfer staged through host copies). Bootstrapped over
// the host communicator: rank 0 of the group draws NCCL's unique id and broadcasts it; split()
// splits the host group and bootstraps NCCL on each new one. Built with the CUDA backend when
// nccl.h is found; libnccl.so.2 is loaded when the first NCCL communicator is made (a single-GPU
// run never needs it), with an Error naming what is missing when it cannot be.
//
// The same rules as the MPI communicator (communicator.h): bf16/fp16 reductions in fp32, rounded
// back once; the collectives run on a stream of the communicator's own, after the work already
// enqueued on the backend's stream, so they overlap the kernels enqueued after them; wait() orders
// the backend's stream after the collective without blocking the host. A watchdog thread checks
// every collective in flight against the group's timeout (--distributed-timeout-minutes) and
// NCCL's asynchronous errors: on either it prints which group and operation failed and aborts the
// whole job, so a dead or hung peer never leaves the others waiting forever.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace megatron {

bool nccl_compiled();  // this build can make NCCL communicators

// An NCCL communicator over the ranks of `host` (collective over them), for tensors on `device`
// (this process's GPU, the CUDA backend initialised on it).
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host,
                                                     Device device);

}  // namespace megatron
