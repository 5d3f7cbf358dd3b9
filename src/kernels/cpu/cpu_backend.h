// The CPU backend: one kernel per op of ops.h, in namespace ops::cpu, with the op's signature
// (declared here from ops.h's own types, so a kernel whose signature drifts fails to link). The
// dispatcher calls them through cpu::kOps for tensors on the CPU; the checking device calls the
// same kernels over its guarded memory.
#pragma once

#include "kernels/backend.h"

namespace megatron::ops::cpu {

#define MG_DECLARE_CPU_KERNEL(name) decltype(ops::name) name;
MG_FOR_EACH_OP(MG_DECLARE_CPU_KERNEL)
#undef MG_DECLARE_CPU_KERNEL

}  // namespace megatron::ops::cpu
