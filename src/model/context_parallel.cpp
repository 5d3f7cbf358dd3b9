// Context-parallel sequence layout, batch slicing and the attention exchange (see
// context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>

#include "model/gpt_model.h"

namespace megatron::model {

ContextParallel ContextParallel::none() {
  static const std::shared_ptr<Communicator> one = make_self_communicator("cp");
  return ContextParallel{one};
}

int64_t context_parallel_position(int64_t i, int64_t local_seq, int rank, int size) {
  if (size == 1) return i;
  const int64_t chunk = local_seq / 2;
  return i < chunk ? int64_t(rank) * chunk + i : int64_t(2 * size - 1 - rank) * chunk + (i - chunk);
}

Tensor context_parallel_positions(int64_t local_seq, int rank, int size) {
  Tensor t = Tensor::empty({local_seq}, DType::I32);
  for (int64_t i = 0; i < local_seq; ++i)
    t.data<int32_t>()[i] = int32_t(context_parallel_position(i, local_seq, rank, size));
  return t;
}

namespace {

// Copies rows between the rank-major layout [C][b][S/C] (what the all-gather produces) and
// sequence order [b][S]: to_sequence = true moves rank-major -> sequence.
void permute_rows(const Tensor& src, const Tensor& dst, int64_t batch, int size, bool to_sequence) {
  const int64_t w = src.size(1), seq = src.size(0) / batch, local = seq / size;
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  for (int r = 0; r < size; ++r)
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t i = 0; i < local; ++i) {
        const int64_t rank_major = (int64_t(r) * batch + bi) * local + i;
        const int64_t in_order = bi * seq + context_parallel_position(i, local, r, size);
        const int64_t from = to_sequence ? rank_major : in_order;
        const int64_t to = to_sequence ? in_order : rank_major;
        std::copy(s + from * w, s + (from + 1) * w, d + to * w);
      }
}

}  // namespace

Tensor GatherFromContextParallelRegion::forward(const ContextParallel& cp, const Tensor& local,
                                                int64_t batch) {
  const int C = cp.size();
  if (C == 1) return local;
  MG_CHECK(local.dim() == 2 && local.size(0) % batch == 0, "context-parallel gather: ",
           shape_str(local.shape()), " is not [batch * local_seq, width]");
  const Tensor in = local.contiguous();
  Tensor gathered = Tensor::empty({C * in.size(0), in.size(1)}, DType::F32);
  cp.group->all_gather(in, gathered);
  Tensor full = Tensor::empty(gathered.shape(), DType::F32);
  permute_rows(gathered, full, batch, C, true);
  return full;
}

Tensor GatherFromContextParallelRegion::backward(const ContextParallel& cp, const Tensor& dfull,
                                                 int64_t batch) {
  const int C = cp.size();
  if (C == 1) return dfull;
  MG_CHECK(dfull.dim() == 2 && dfull.size(0) % (batch * C) == 0, "context-parallel "
           "reduce-scatter: ", shape_str(dfull.shape()), " is not [batch * seq, width]");
  const Tensor in = dfull.contiguous();
  Tensor rank_major = Tensor::empty(in.shape(), DType::F32);
  permute_rows(in, rank_major, batch, C, false);
  Tensor out = Tensor::empty({in.size(0) / C, in.size(1)}, DType::F32);
  cp.group->reduce_scatter(rank_major, out, ReduceOp::Sum);
  return out;
}

GPTInputs slice_for_context_parallel(const GPTInputs& in, int rank, int size) {
  if (size == 1) return in;
  MG_REQUIRE(in.tokens.defined() && in.tokens.dim() == 2, "context parallelism: tokens must be "
             "a [batch, seq] tensor");
  const int64_t b = in.tokens.size(0), s = in.tokens.size(1);
  MG_REQUIRE(s % (2 * size) == 0, "sequence length ", s, " is not divisible by 2 x "
             "--context-parallel-size = ", 2 * size, " (the sequence is cut into 2 x CP chunks "
             "for causal load balancing)");
  const int64_t local = s / size;
  auto slice = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    MG_REQUIRE(t.shape() == in.tokens.shape(), "context parallelism: a batch tensor has shape ",
               shape_str(t.shape()), ", not the tokens' ", shape_str(in.tokens.shape()));
    const Tensor src = t.contiguous();
    Tensor out = Tensor::empty({b, local}, src.dtype());
    const size_t el = dtype_size(src.dtype());
    const char* sp = static_cast<const char*>(src.raw_data());
    char* op = static_cast<char*>(out.raw_data());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < local; ++i)
        std::copy_n(sp + size_t(bi * s + context_parallel_position(i, local, rank, size)) * el, el,
                    op + size_t(bi * local + i) * el);
    return out;
  };
  return GPTInputs{slice(in.tokens), slice(in.position_ids), slice(in.attention_start),
                   slice(in.labels), slice(in.loss_mask)};
}

}  // namespace megatron::model
