// The checking device's backend (DeviceType::Checked, for tests): every op runs the CPU kernel
// with the memory of the call's tensors opened for the call (core/checked_memory.h), so results
// equal the CPU's bit for bit, while host code that touches tensor memory outside ops and
// explicit copies throws or faults. Model, comm and optim code run on Device::checked() in tests
// to prove they compute only through ops.
#pragma once

#include "kernels/backend.h"

namespace megatron::ops {

// Registers the checking device's memory and op table (idempotent); returns Device::checked().
Device register_checked_backend();
const OpTable& checked_op_table();

}  // namespace megatron::ops
