// The local token dispatcher (see token_dispatcher.h). Rows move with ops::index_select_rows and
// ops::index_copy_rows; the per-row probability products are batched [1 x 1] x [1 x h] matrix
// products (ops::gemm_batched), so every step runs through the op interface on any device.
#include "model/moe/token_dispatcher.h"

#include "kernels/ops.h"

namespace megatron::model {

DispatchPlan LocalTokenDispatcher::plan(const Routing& r, Device device) const {
  DispatchPlan p;
  p.num_tokens = r.num_tokens;
  p.num_experts = r.num_experts;
  p.counts.assign(size_t(r.num_experts), 0);
  std::vector<float> probs;
  const int E = r.num_experts;
  for (int e = 0; e < E; ++e)
    for (int64_t t = 0; t < r.num_tokens; ++t)
      if (r.map[size_t(t * E + e)]) {
        p.token.push_back(int32_t(t));
        probs.push_back(float(r.probs[size_t(t * E + e)]));
        ++p.counts[size_t(e)];
      }
  const int64_t M = p.rows();
  if (M > 0) {
    p.index = Tensor::from_vector(p.token, {M}, device);
    p.probs = Tensor::from_vector(probs, {M, 1, 1}, device);
  }
  return p;
}

Tensor LocalTokenDispatcher::dispatch(const DispatchPlan& p, const Tensor& x) const {
  Tensor xp = Tensor::empty({p.rows(), x.size(1)}, x.dtype(), x.device());
  if (p.rows() > 0) ops::index_select_rows(xp, x, p.index);
  return xp;
}

void LocalTokenDispatcher::dispatch_backward(const DispatchPlan& p, const Tensor& dxp,
                                             const Tensor& dx) const {
  if (p.rows() > 0) ops::index_copy_rows(dx, dxp, p.index, /*accumulate=*/true);
}

Tensor LocalTokenDispatcher::combine(const DispatchPlan& p, const Tensor& y) const {
  const int64_t h = y.size(1), M = p.rows();
  Tensor out = Tensor::zeros({p.num_tokens, h}, DType::F32, y.device());
  if (M == 0) return out;
  Tensor weighted = Tensor::empty({M, 1, h}, DType::F32, y.device());
  ops::gemm_batched(p.probs, false, y.view({M, 1, h}), false, weighted);
  ops::index_copy_rows(out, weighted.view({M, h}), p.index, /*accumulate=*/true);
  return out;
}

Tensor LocalTokenDispatcher::combine_backward(const DispatchPlan& p, const Tensor& dout,
                                              const Tensor& y, std::vector<double>& dprobs) const {
  const int64_t h = dout.size(1), M = p.rows();
  const int E = p.num_experts;
  dprobs.assign(size_t(p.num_tokens * E), 0.0);
  Tensor dy = Tensor::empty({M, h}, DType::F32, dout.device());
  if (M == 0) return dy;
  Tensor dw = Tensor::empty({M, h}, DType::F32, dout.device());
  ops::index_select_rows(dw, dout, p.index);
  ops::gemm_batched(p.probs, false, dw.view({M, 1, h}), false, dy.view({M, 1, h}));
  Tensor dp = Tensor::empty({M, 1, 1}, DType::F32, dout.device());
  ops::gemm_batched(dw.view({M, 1, h}), false, y.view({M, 1, h}), true, dp);
  const Tensor host = dp.to(Device::cpu());
  const float* d = host.data<float>();
  int64_t m = 0;
  for (int e = 0; e < E; ++e)
    for (int64_t i = 0; i < p.counts[size_t(e)]; ++i, ++m)
      dprobs[size_t(int64_t(p.token[size_t(m)]) * E + e)] = d[m];
  return dy;
}

}  // namespace megatron::model
