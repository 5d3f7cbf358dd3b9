// Splits, gathers and reductions behind the tensor-parallel mappings (see tp_mappings.h).
#include "comm/tp_mappings.h"

namespace megatron::tp {

namespace {

int64_t shard(Communicator& g, const Tensor& x, int dim, const char* what) {
  MG_REQUIRE(x.dim() >= 1, what, ": tensor needs at least one dimension");
  const int64_t n = x.size(dim);
  MG_REQUIRE(n % g.size() == 0, what, ": dimension ", (dim < 0 ? x.dim() + dim : dim), " of ",
             shape_str(x.shape()), " (", n, ") is not divisible by the size of group '", g.name(),
             "' (", g.size(), ")");
  return n / g.size();
}


}  // namespace

Tensor split_along_last_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  const int64_t n = shard(g, x, -1, "split along the last dimension");
  Shape s = x.shape();
  s.back() = n;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  // This rank's column block of x seen as [rows, size * n]: a row-strided copy.
  const int64_t rows = out.numel() / n;
  out.view({rows, n}).copy_(x.contiguous().view({rows, n * g.size()}).narrow(1, g.rank() * n, n));
  return out;
}

Tensor split_along_first_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  const int64_t n = shard(g, x, 0, "split along the first dimension");
  return x.narrow(0, g.rank() * n, n).contiguous();
}

Tensor all_reduce(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  Tensor y = x.clone();
  g.all_reduce(y, ReduceOp::Sum);
  return y;
}

Tensor all_gather_first_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  MG_REQUIRE(x.dim() >= 1, "all-gather along the first dimension: tensor needs a dimension");
  Shape s = x.shape();
  s[0] *= g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  g.all_gather(x.contiguous(), out);
  return out;
}

Tensor all_gather_last_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  MG_REQUIRE(x.dim() >= 1, "all-gather along the last dimension: tensor needs a dimension");
  Shape buf_shape = {int64_t(g.size())};
  buf_shape.insert(buf_shape.end(), x.shape().begin(), x.shape().end());
  Tensor buf = Tensor::empty(buf_shape, x.dtype(), x.device());
  g.all_gather(x.contiguous(), buf);
  Shape s = x.shape();
  const int64_t n = s.back();
  s.back() *= g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  // buf is [P, rows, n]; out row i is [buf[0][i], buf[1][i], ...]: rank r's block is the column
  // block r of out seen as [rows, P * n] (row-strided copies).
  const int64_t rows = x.numel() / n;
  const Tensor out2 = out.view({rows, n * g.size()});
  for (int r = 0; r < g.size(); ++r) out2.narrow(1, r * n, n).copy_(buf.select(0, r).view({rows, n}));
  return out;
}

Tensor reduce_scatter_first_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  const int64_t n = shard(g, x, 0, "reduce-scatter along the first dimension");
  Shape s = x.shape();
  s[0] = n;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  g.reduce_scatter(x.contiguous(), out, ReduceOp::Sum);
  return out;
}

}  // namespace megatron::tp
