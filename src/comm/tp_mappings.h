// Tensor-parallel mappings: the conjugate communication pairs that parallel layers are built
// from (the transformer never calls a collective directly). Each mapping is a struct with its
// forward and its backward side by side, over the tensor-parallel group `g`:
//
//   mapping                                   forward                    backward
//   CopyToTensorParallelRegion                identity                   all-reduce
//   ReduceFromTensorParallelRegion            all-reduce                 identity
//   ScatterToTensorParallelRegion             split last dim             all-gather last dim
//   GatherFromTensorParallelRegion            all-gather last dim        split last dim
//   ScatterToSequenceParallelRegion           split dim 0                all-gather dim 0
//   GatherFromSequenceParallelRegion          all-gather dim 0           reduce-scatter dim 0
//   ReduceScatterToSequenceParallelRegion     reduce-scatter dim 0       all-gather dim 0
//
// Inputs are never modified; results are new tensors (identity returns its input). Split
// dimensions must be divisible by the group size. With a group of one every mapping is identity.
#pragma once

#include "comm/communicator.h"

namespace megatron::tp {

// Building blocks (exposed for layers that need them directly, e.g. the embedding).
Tensor split_along_last_dim(Communicator& g, const Tensor& x);
Tensor split_along_first_dim(Communicator& g, const Tensor& x);
Tensor all_reduce(Communicator& g, const Tensor& x);
Tensor all_gather_last_dim(Communicator& g, const Tensor& x);
Tensor all_gather_first_dim(Communicator& g, const Tensor& x);
Tensor reduce_scatter_first_dim(Communicator& g, const Tensor& x);

struct CopyToTensorParallelRegion {
  static Tensor forward(Communicator&, const Tensor& x) { return x; }
  static Tensor backward(Communicator& g, const Tensor& dy) { return all_reduce(g, dy); }
};

struct ReduceFromTensorParallelRegion {
  static Tensor forward(Communicator& g, const Tensor& x) { return all_reduce(g, x); }
  static Tensor backward(Communicator&, const Tensor& dy) { return dy; }
};

struct ScatterToTensorParallelRegion {
  static Tensor forward(Communicator& g, const Tensor& x) { return split_along_last_dim(g, x); }
  static Tensor backward(Communicator& g, const Tensor& dy) { return all_gather_last_dim(g, dy); }
};

struct GatherFromTensorParallelRegion {
  static Tensor forward(Communicator& g, const Tensor& x) { return all_gather_last_dim(g, x); }
  static Tensor backward(Communicator& g, const Tensor& dy) { return split_along_last_dim(g, dy); }
};

struct ScatterToSequenceParallelRegion {
  static Tensor forward(Communicator& g, const Tensor& x) { return split_along_first_dim(g, x); }
  static Tensor backward(Communicator& g, const Tensor& dy) { return all_gather_first_dim(g, dy); }
};

struct GatherFromSequenceParallelRegion {
  static Tensor forward(Communicator& g, const Tensor& x) { return all_gather_first_dim(g, x); }
  static Tensor backward(Communicator& g, const Tensor& dy) {
    return reduce_scatter_first_dim(g, dy);
  }
};

struct ReduceScatterToSequenceParallelRegion {
  static Tensor forward(Communicator& g, const Tensor& x) { return reduce_scatter_first_dim(g, x); }
  static Tensor backward(Communicator& g, const Tensor& dy) { return all_gather_first_dim(g, dy); }
};

// Function-style names as in Megatron (forward direction).
inline Tensor copy_to_tensor_model_parallel_region(Communicator& g, const Tensor& x) {
  return CopyToTensorParallelRegion::forward(g, x);
}
inline Tensor reduce_from_tensor_model_parallel_region(Communicator& g, const Tensor& x) {
  return ReduceFromTensorParallelRegion::forward(g, x);
}
inline Tensor scatter_to_tensor_model_parallel_region(Communicator& g, const Tensor& x) {
  return ScatterToTensorParallelRegion::forward(g, x);
}
inline Tensor gather_from_tensor_model_parallel_region(Communicator& g, const Tensor& x) {
  return GatherFromTensorParallelRegion::forward(g, x);
}
inline Tensor scatter_to_sequence_parallel_region(Communicator& g, const Tensor& x) {
  return ScatterToSequenceParallelRegion::forward(g, x);
}
inline Tensor gather_from_sequence_parallel_region(Communicator& g, const Tensor& x) {
  return GatherFromSequenceParallelRegion::forward(g, x);
}
inline Tensor reduce_scatter_to_sequence_parallel_region(Communicator& g, const Tensor& x) {
  return ReduceScatterToSequenceParallelRegion::forward(g, x);
}

}  // namespace megatron::tp
