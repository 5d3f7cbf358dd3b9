// One rank of a parallel layout run alone in this process (`plan --measure`): a world
// communicator of the layout's size whose peers do not exist. Its groups (split) have the sizes
// and this rank's positions of the real layout (comm/parallel_state.h), so every tensor is shaped
// and every schedule runs exactly as on that rank; the collectives only do this rank's share of
// the data movement: a reduction leaves the local values, an all-gather replicates the local
// slice, a reduce-scatter keeps the local slice, a receive delivers zeros, sends and barriers
// complete at once. Compute and memory are the real rank's; the time communication would take is
// left to the time model (time_model.h).
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/parallel_state.h"

namespace megatron::plan {

// World rank `rank` of the layout `config` (config.world_size ranks).
std::shared_ptr<Communicator> make_simulated_world(const ParallelConfig& config, int rank);

}  // namespace megatron::plan
