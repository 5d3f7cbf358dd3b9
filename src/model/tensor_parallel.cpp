// Shards, gathers and the sequence-parallel gradient reduction (see tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <vector>

#include "comm/tp_mappings.h"
#include "kernels/ops.h"

namespace megatron::model {

TensorParallel TensorParallel::none() {
  static const std::shared_ptr<Communicator> one = make_self_communicator("tp");
  return TensorParallel{one, false, nullptr, false, nullptr};
}

TensorParallel TensorParallel::make(std::shared_ptr<Communicator> group, bool sequence_parallel) {
  MG_CHECK(group != nullptr, "TensorParallel::make: null tensor-parallel group");
  const bool sp = sequence_parallel && group->size() > 1;
  return TensorParallel{std::move(group), sp, nullptr, false, nullptr};
}

TensorParallel TensorParallel::experts() const {
  if (!expert_tensor_parallel) return *this;
  TensorParallel e = *this;
  e.group = expert_tensor_parallel;
  e.sequence_parallel = false;
  e.expert_tensor_parallel = nullptr;
  return e;
}

Shape full_shape(const Parameter& p, int tp_size) {
  Shape s = p.value.shape();
  if (p.partition_dim >= 0) s[size_t(p.partition_dim)] *= tp_size;
  return s;
}

Tensor shard_along(const Tensor& full, int dim, int rank, int size, int parts) {
  if (dim < 0 || size == 1) return full;
  MG_CHECK(dim < full.dim() && rank >= 0 && rank < size && parts >= 1, "shard_along: dim ", dim,
           " rank ", rank, " of ", size, " (", parts, " parts) for ", shape_str(full.shape()));
  const int64_t n = full.size(dim);
  MG_REQUIRE(n % (size * parts) == 0, "cannot split dimension ", dim, " of ",
             shape_str(full.shape()), " into ", size, " tensor-parallel shards",
             parts > 1 ? str(" of each of its ", parts, " blocks") : std::string());
  const int64_t block = n / parts, piece = block / size;
  if (parts == 1) return full.narrow(dim, rank * piece, piece).contiguous();
  Shape shape = full.shape();
  shape[size_t(dim)] = piece * parts;
  Tensor out = Tensor::empty(shape, full.dtype(), full.device());
  for (int p = 0; p < parts; ++p)
    out.narrow(dim, p * piece, piece).copy_(full.narrow(dim, p * block + rank * piece, piece));
  return out;
}

Tensor shard_parameter(const Tensor& full, const Parameter& p, int rank, int size) {
  return shard_along(full, p.partition_dim, rank, size, p.partition_parts);
}

Tensor gather_along(Communicator& tp, const Tensor& local, int dim) {
  if (dim < 0 || tp.size() == 1) return local;
  if (dim == 0) return tp::all_gather_first_dim(tp, local);
  MG_CHECK(dim == local.dim() - 1, "gather_along: only the first or last dimension (got ", dim,
           " of ", shape_str(local.shape()), ")");
  return tp::all_gather_last_dim(tp, local);
}

void all_reduce_sequence_parallel_grads(const ParameterList& params, Communicator& tp) {
  if (tp.size() == 1) return;
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (const Parameter* p : params) {
    if (!p->sequence_parallel) continue;
    MG_CHECK(p->grad.dtype() == DType::F32 && p->grad.is_contiguous(), "gradient of ", p->name,
             " must be contiguous fp32");
    grads.push_back(p->grad);
    total += p->grad.numel();
  }
  if (total == 0) return;
  Tensor flat = Tensor::empty({total}, DType::F32, grads.front().device());
  ops::copy_to_flat(flat, grads);
  tp.all_reduce(flat, ReduceOp::Sum);
  ops::copy_from_flat(grads, flat);
}

double local_grad_sum_of_squares(const ParameterList& params, int tp_rank) {
  std::vector<Tensor> counted;  // summed in parameter order, read back from the device once
  for (const Parameter* p : params)
    if (param_counts_in_grad_norm(*p, tp_rank)) counted.push_back(p->grad);
  double s = 0;
  for (const double sq : ops::l2_norm_squared_each(counted)) s += sq;
  return s;
}

}  // namespace megatron::model
