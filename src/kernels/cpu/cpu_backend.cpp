// The CPU backend's op table: every op has a CPU kernel (the reference for the other backends).
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {

#define MG_CPU_ENTRY(name) .name = &cpu::name,
constinit const OpTable kOps = {MG_FOR_EACH_OP(MG_CPU_ENTRY)};
#undef MG_CPU_ENTRY

}  // namespace megatron::ops::cpu
