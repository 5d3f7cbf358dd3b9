// What every layer shares: the per-call LayerContext (training, saving, dropout streams, batch
// geometry) and Weight, a Parameter with the fp32 working copy compute reads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "model/parameter.h"

namespace megatron::model {

// Per-call state every layer sees. batch and seq are the full micro-batch: under sequence
// parallelism a layer's input may hold only a block of its rows (see parallel_layers.h).
struct LayerContext {
  bool training = false;  // dropout active
  bool save = false;      // keep activations for backward
  bool recompute_core_attention = false;  // selective recompute: no s x s probabilities kept
  uint64_t seed = 0, dropout_offset = 0;
  int64_t batch = 0, seq = 0;
  Tensor attention_start;  // [b, s] int32 or undefined
  // Context parallelism (context_parallel.h): seq is this rank's S/C tokens (chunks cp_rank and
  // 2*cp_size-1-cp_rank of the sequence). Dropout masks are indexed by the element's position in
  // the unsplit tensors (for_each_sequence_run), so they do not depend on CP either.
  int cp_rank = 0, cp_size = 1;
  // Dropout stream for (micro-batch offset, layer, site): stream = offset << 24 | layer << 4 |
  // site, so every mask is a pure function of (seed, offset, layer, site, element).
  // element_offset: index of the first element of the tensor this mask covers within the whole
  // (unsharded) tensor, for a sequence-parallel shard.
  ops::DropoutSpec dropout(float p, int layer, int site, uint64_t element_offset = 0) const;
  int64_t rows() const { return batch * seq; }
  // Calls fn(first, n, element_offset) for each run of rows [row0, row0 + rows) of this rank's
  // [batch*seq, width] activation that is contiguous in the unsplit [batch*seq*cp_size, width]
  // one: rows row0 + first .. + n, whose first element has index element_offset there. Without
  // context parallelism that is one run (0, rows, row0 * width).
  template <class Fn>
  void for_each_sequence_run(int64_t row0, int64_t rows, int64_t width, Fn&& fn) const {
    if (cp_size == 1) {
      fn(int64_t(0), rows, uint64_t(row0 * width));
      return;
    }
    const int64_t half = seq / 2, end = row0 + rows;
    for (int64_t r = row0; r < end;) {
      const int64_t bi = r / seq, i = r % seq;
      const int64_t n = std::min(end, bi * seq + (i < half ? half : seq)) - r;
      const int64_t global_row = bi * seq * cp_size + context_parallel_position(i, seq, cp_rank, cp_size);
      fn(r - row0, n, uint64_t(global_row * width));
      r += n;
    }
  }
};

enum DropoutSite : int { kSiteEmbedding = 0, kSiteAttentionProbs = 1, kSiteAttentionOut = 2,
                         kSiteMlpOut = 3 };

size_t bytes_of(const Tensor& t);

// A weight as layers use it: the Parameter plus the fp32 copy used in compute.
struct Weight {
  Parameter param;
  Tensor f32;  // fp32 view/copy of param.value
  // shape is this rank's shard; pdim the TP partition dim (-1: replicated); sp marks a replicated
  // parameter whose gradient is a per-sequence-shard partial sum (Parameter::sequence_parallel).
  void init(const std::string& name, const Shape& shape, DType dtype, bool decay, int pdim,
            bool sp = false);
  void refresh();  // param.value -> f32 (no-op for fp32 params)
};

}  // namespace megatron::model
