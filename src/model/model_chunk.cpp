// The context-parallel slice of a micro-batch (model_chunk.h).
#include "model/model_chunk.h"

#include <vector>

#include "kernels/ops.h"
#include "model/context_parallel.h"

namespace megatron::model {

Batch slice_for_context_parallel(const Batch& in, int rank, int size) {
  if (size == 1) return in;
  MG_REQUIRE(in.tokens.defined() && in.tokens.dim() == 2, "context parallelism: tokens must be "
             "a [batch, seq] tensor");
  const int64_t b = in.tokens.size(0), s = in.tokens.size(1);
  MG_REQUIRE(s % (2 * size) == 0, "sequence length ", s, " is not divisible by 2 x "
             "--context-parallel-size = ", 2 * size, " (the sequence is cut into 2 x CP chunks "
             "for causal load balancing)");
  const int64_t local = s / size;
  // Element (bi, i) of a slice is element (bi, position i of this rank) of the batch tensor.
  std::vector<int32_t> source(static_cast<size_t>(b * local));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < local; ++i)
      source[size_t(bi * local + i)] = int32_t(bi * s + context_parallel_position(i, local, rank, size));
  const Tensor index = Tensor::from_vector(source, {b * local}, in.tokens.device());
  auto slice = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    MG_REQUIRE(t.shape() == in.tokens.shape(), "context parallelism: a batch tensor has shape ",
               shape_str(t.shape()), ", not the tokens' ", shape_str(in.tokens.shape()));
    const Tensor src = t.contiguous();
    Tensor out = Tensor::empty({b, local}, src.dtype(), src.device());
    ops::index_select_rows(out.view({b * local, 1}), src.view({b * s, 1}), index);
    return out;
  };
  Batch out = in;  // per-sequence tensors stay whole
  out.tokens = slice(in.tokens);
  out.position_ids = slice(in.position_ids);
  out.attention_start = slice(in.attention_start);
  out.labels = slice(in.labels);
  out.loss_mask = slice(in.loss_mask);
  out.padding_mask = slice(in.padding_mask);
  out.token_types = slice(in.token_types);
  return out;
}

}  // namespace megatron::model
