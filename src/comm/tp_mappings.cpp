// Splits, gathers and reductions behind the tensor-parallel mappings (see tp_mappings.h).
#include "comm/tp_mappings.h"

#include <cstring>

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

// Copies `rows` runs of `run` bytes: dst run i at dst + i*dst_stride, src at src + i*src_stride.
void copy_runs(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t rows,
               int64_t run) {
  for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * dst_stride, src + i * src_stride, size_t(run));
}

}  // namespace

Tensor split_along_last_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  const int64_t n = shard(g, x, -1, "split along the last dimension");
  const Tensor xc = x.contiguous();
  Shape s = x.shape();
  s.back() = n;
  Tensor out = Tensor::empty(s, x.dtype());
  const int64_t es = int64_t(dtype_size(x.dtype())), rows = n == 0 ? 0 : out.numel() / n;
  copy_runs(static_cast<char*>(out.raw_data()), n * es,
            static_cast<const char*>(xc.raw_data()) + g.rank() * n * es, n * g.size() * es, rows,
            n * es);
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
  Tensor out = Tensor::empty(s, x.dtype());
  g.all_gather(x.contiguous(), out);
  return out;
}

Tensor all_gather_last_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  MG_REQUIRE(x.dim() >= 1, "all-gather along the last dimension: tensor needs a dimension");
  Shape buf_shape = {int64_t(g.size())};
  buf_shape.insert(buf_shape.end(), x.shape().begin(), x.shape().end());
  Tensor buf = Tensor::empty(buf_shape, x.dtype());
  g.all_gather(x.contiguous(), buf);
  Shape s = x.shape();
  const int64_t n = s.back();
  s.back() *= g.size();
  Tensor out = Tensor::empty(s, x.dtype());
  // buf is [P, rows, n]; out row i is [buf[0][i], buf[1][i], ...].
  const int64_t es = int64_t(dtype_size(x.dtype())), rows = n == 0 ? 0 : x.numel() / n;
  for (int r = 0; r < g.size(); ++r) {
    copy_runs(static_cast<char*>(out.raw_data()) + r * n * es, n * g.size() * es,
              static_cast<const char*>(buf.raw_data()) + r * rows * n * es, n * es, rows, n * es);
  }
  return out;
}

Tensor reduce_scatter_first_dim(Communicator& g, const Tensor& x) {
  if (g.size() == 1) return x;
  const int64_t n = shard(g, x, 0, "reduce-scatter along the first dimension");
  Shape s = x.shape();
  s[0] = n;
  Tensor out = Tensor::empty(s, x.dtype());
  g.reduce_scatter(x.contiguous(), out, ReduceOp::Sum);
  return out;
}

}  // namespace megatron::tp
