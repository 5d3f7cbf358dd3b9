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

// ---- the expert-parallel dispatcher -----------------------------------------------------------
namespace megatron::model {

namespace {

Tensor rows_tensor(const std::vector<int32_t>& index, Device device) {
  return index.empty() ? Tensor() : Tensor::from_vector(index, {int64_t(index.size())}, device);
}

// out[i] = in[index[i]] for [n, h] rows (nothing to do for no rows).
Tensor select_rows(const Tensor& in, const Tensor& index, int64_t n) {
  Tensor out = Tensor::empty({n, in.size(1)}, in.dtype(), in.device());
  if (n > 0) ops::index_select_rows(out, in, index);
  return out;
}

std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t h) {
  std::vector<int64_t> out(rows);
  for (int64_t& v : out) v *= h;
  return out;
}

// The rows of `rows` [*, h] sent by all-to-all-v: send[j] rows to rank j, recv[i] from rank i.
Tensor exchange_rows(Communicator& c, const Tensor& rows, const std::vector<int64_t>& send,
                     const std::vector<int64_t>& recv) {
  const int64_t h = rows.size(1);
  int64_t n = 0;
  for (int64_t v : recv) n += v;
  Tensor out = Tensor::empty({n, h}, rows.dtype(), rows.device());
  c.all_to_all_v(rows.contiguous(), times(send, h), out, times(recv, h));
  return out;
}

}  // namespace

DispatcherKind parse_dispatcher_kind(const std::string& name) {
  if (name == "allgather") return DispatcherKind::allgather;
  if (name == "alltoall") return DispatcherKind::alltoall;
  MG_REQUIRE(name != "flex", "--moe-token-dispatcher-type flex (DeepEP) is not built; use "
             "allgather or alltoall");
  MG_THROW("--moe-token-dispatcher-type '", name, "' is not one of: allgather, alltoall, flex");
}

TokenDispatcher::TokenDispatcher(DispatcherKind kind, std::shared_ptr<Communicator> ep,
                                 int num_experts)
    : kind_(kind), ep_(std::move(ep)), num_experts_(num_experts) {
  MG_REQUIRE(num_experts_ % ep_size() == 0, "--num-experts ", num_experts_,
             " is not divisible by --expert-model-parallel-size ", ep_size());
}

int64_t TokenDispatcher::Plan::expert_rows() const {
  int64_t n = 0;
  for (int64_t v : expert_counts) n += v;
  return n;
}

TokenDispatcher::Plan TokenDispatcher::plan(const Routing& r, Device device) const {
  Plan p;
  p.num_tokens = r.num_tokens;
  const int P = ep_size(), L = local_experts();
  if (local()) {
    p.local = local_.plan(r, device);
    p.expert_counts = p.local.counts;
    return p;
  }
  if (kind_ == DispatcherKind::allgather) {
    // The group's routing, gathered: probabilities and choices of every rank's tokens.
    const int64_t ne = r.num_tokens * num_experts_;
    Tensor mine = Tensor::empty({2 * ne}, DType::F64);
    double* m = mine.data<double>();
    for (int64_t i = 0; i < ne; ++i) {
      m[i] = r.probs[size_t(i)];
      m[ne + i] = r.map[size_t(i)] ? 1.0 : 0.0;
    }
    Tensor all = Tensor::empty({P * 2 * ne}, DType::F64);
    ep_->all_gather(mine, all);
    Routing g;
    g.num_tokens = P * r.num_tokens;
    g.num_experts = L;
    g.probs.assign(size_t(g.num_tokens * L), 0.0);
    g.map.assign(size_t(g.num_tokens * L), 0);
    const double* a = all.data<double>();
    for (int q = 0; q < P; ++q)
      for (int64_t t = 0; t < r.num_tokens; ++t)
        for (int l = 0; l < L; ++l) {
          const int64_t src = q * 2 * ne + t * num_experts_ + first_expert() + l;
          const size_t dst = size_t((q * r.num_tokens + t) * L + l);
          g.probs[dst] = a[src];
          g.map[dst] = a[src + ne] != 0.0;
        }
    p.local = local_.plan(g, device);
    p.expert_counts = p.local.counts;
    return p;
  }
  // alltoall: this rank's rows by expert; rank j's experts' rows go to rank j.
  p.local = local_.plan(r, device);
  p.send_rows.assign(size_t(P), 0);
  for (int e = 0; e < num_experts_; ++e) p.send_rows[size_t(e / L)] += p.local.counts[size_t(e)];
  // Rank i's counts for each of this rank's experts: [P, L], row i from rank i.
  const Tensor counts = Tensor::from_vector(p.local.counts, {int64_t(num_experts_)});
  Tensor got = Tensor::empty({int64_t(P) * L}, DType::I64);
  ep_->all_to_all(counts, got);
  const int64_t* c = got.data<int64_t>();
  p.recv_rows.assign(size_t(P), 0);
  p.expert_counts.assign(size_t(L), 0);
  std::vector<int64_t> block(size_t(P * L));  // first received row of (rank i, expert l)
  int64_t off = 0;
  for (int i = 0; i < P; ++i)
    for (int l = 0; l < L; ++l) {
      block[size_t(i * L + l)] = off;
      off += c[i * L + l];
      p.recv_rows[size_t(i)] += c[i * L + l];
      p.expert_counts[size_t(l)] += c[i * L + l];
    }
  // Megatron's sort_chunks_by_idxs: (rank, expert) chunks into (expert, rank) order.
  std::vector<int32_t> sort(static_cast<size_t>(off)), unsort(static_cast<size_t>(off));
  size_t s = 0;
  for (int l = 0; l < L; ++l)
    for (int i = 0; i < P; ++i)
      for (int64_t k = 0; k < c[i * L + l]; ++k, ++s) {
        sort[s] = int32_t(block[size_t(i * L + l)] + k);
        unsort[size_t(sort[s])] = int32_t(s);
      }
  p.sort_index = rows_tensor(sort, device);
  p.unsort_index = rows_tensor(unsort, device);
  return p;
}

Tensor TokenDispatcher::to_experts(const Plan& p, const Tensor& rows) const {
  const Tensor received = exchange_rows(*ep_, rows, p.send_rows, p.recv_rows);
  return select_rows(received, p.sort_index, p.expert_rows());
}

Tensor TokenDispatcher::from_experts(const Plan& p, const Tensor& rows) const {
  const Tensor by_rank = select_rows(rows, p.unsort_index, p.expert_rows());
  return exchange_rows(*ep_, by_rank, p.recv_rows, p.send_rows);
}

Tensor TokenDispatcher::dispatch(const Plan& p, const Tensor& x) const {
  if (local()) return local_.dispatch(p.local, x);
  if (kind_ == DispatcherKind::alltoall) return to_experts(p, local_.dispatch(p.local, x));
  const Tensor xc = x.contiguous();
  Tensor all = Tensor::empty({ep_size() * x.size(0), x.size(1)}, x.dtype(), x.device());
  ep_->all_gather(xc, all);
  return local_.dispatch(p.local, all);
}

void TokenDispatcher::dispatch_backward(const Plan& p, const Tensor& dxp, const Tensor& dx) const {
  if (local()) return local_.dispatch_backward(p.local, dxp, dx);
  if (kind_ == DispatcherKind::alltoall)
    return local_.dispatch_backward(p.local, from_experts(p, dxp), dx);
  Tensor all = Tensor::zeros({ep_size() * dx.size(0), dx.size(1)}, DType::F32, dx.device());
  local_.dispatch_backward(p.local, dxp, all);
  Tensor mine = Tensor::empty({dx.size(0), dx.size(1)}, DType::F32, dx.device());
  ep_->reduce_scatter(all, mine);
  ops::add(dx, dx, mine);
}

Tensor TokenDispatcher::return_rows(const Plan& p, const Tensor& y) const {
  return !local() && kind_ == DispatcherKind::alltoall ? from_experts(p, y) : y;
}

Tensor TokenDispatcher::return_rows_backward(const Plan& p, const Tensor& dyr) const {
  return !local() && kind_ == DispatcherKind::alltoall ? to_experts(p, dyr) : dyr;
}

Tensor TokenDispatcher::combine(const Plan& p, const Tensor& yr) const {
  if (local() || kind_ == DispatcherKind::alltoall) return local_.combine(p.local, yr);
  const Tensor partial = local_.combine(p.local, yr);  // [P * N, h]: the group's tokens
  Tensor out = Tensor::empty({p.num_tokens, yr.size(1)}, DType::F32, yr.device());
  ep_->reduce_scatter(partial, out);
  return out;
}

Tensor TokenDispatcher::combine_backward(const Plan& p, const Tensor& dout, const Tensor& yr,
                                         std::vector<double>& dprobs) const {
  if (local() || kind_ == DispatcherKind::alltoall)
    return local_.combine_backward(p.local, dout, yr, dprobs);
  const int P = ep_size(), L = local_experts();
  const Tensor dc = dout.contiguous();
  Tensor all = Tensor::empty({P * dout.size(0), dout.size(1)}, dout.dtype(), dout.device());
  ep_->all_gather(dc, all);
  std::vector<double> local_dprobs;  // [P * N, L]
  Tensor dy = local_.combine_backward(p.local, all, yr, local_dprobs);
  // Each token's probability gradients come from the ranks of its experts: summed back.
  const int64_t N = p.num_tokens;
  Tensor spread = Tensor::zeros({P * N * num_experts_}, DType::F64);
  double* s = spread.data<double>();
  for (int64_t t = 0; t < P * N; ++t)
    for (int l = 0; l < L; ++l)
      s[t * num_experts_ + first_expert() + l] = local_dprobs[size_t(t * L + l)];
  Tensor mine = Tensor::empty({N * num_experts_}, DType::F64);
  ep_->reduce_scatter(spread, mine);
  dprobs.assign(mine.data<double>(), mine.data<double>() + N * num_experts_);
  return dy;
}

}  // namespace megatron::model
