// The local token dispatcher (see token_dispatcher.h). Rows move with ops::index_select_rows and
// ops::index_copy_rows; the per-row probability products are batched [1 x 1] x [1 x h] matrix
// products (ops::gemm_batched), so every step runs through the op interface on any device.
#include "model/moe/token_dispatcher.h"

#include "kernels/op_profile.h"
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

// ---- the expert- and tensor-parallel dispatcher -----------------------------------------------
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

// All-gather of uneven row blocks (Megatron's gather_from_sequence_parallel_region with
// output_split_sizes): rank t holds counts[t] rows; every rank gets all of them in rank order.
// An all-to-all-v in which each rank sends its rows to every rank.
Tensor all_gather_rows(Communicator& c, const Tensor& rows, const std::vector<int64_t>& counts) {
  const int T = c.size();
  const int64_t mine = rows.size(0);
  MG_CHECK(counts.at(size_t(c.rank())) == mine, "all_gather_rows: ", mine, " rows, planned ",
           counts[size_t(c.rank())]);
  Tensor send = Tensor::empty({T * mine, rows.size(1)}, rows.dtype(), rows.device());
  if (mine > 0)
    for (int t = 0; t < T; ++t) send.narrow(0, t * mine, mine).copy_(rows);
  return exchange_rows(c, send, std::vector<int64_t>(size_t(T), mine), counts);
}

// Its conjugate (reduce_scatter_to_sequence_parallel_region with input_split_sizes): rows
// [sum counts, h] in rank blocks; rank t gets block t summed over the ranks, [counts[t], h] fp32.
Tensor reduce_scatter_rows(Communicator& c, const Tensor& rows, const std::vector<int64_t>& counts) {
  const int T = c.size();
  const int64_t mine = counts.at(size_t(c.rank()));
  const Tensor got = exchange_rows(c, rows.to(DType::F32), counts,
                                   std::vector<int64_t>(size_t(T), mine));  // [T * mine, h]
  Tensor out = Tensor::empty({mine, rows.size(1)}, DType::F32, rows.device());
  if (mine == 0) return out;
  out.copy_(got.narrow(0, 0, mine));
  for (int t = 1; t < T; ++t) ops::add(out, out, got.narrow(0, t * mine, mine));
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
                                 int num_experts, std::shared_ptr<Communicator> etp)
    : kind_(kind), ep_(std::move(ep)), etp_(std::move(etp)), num_experts_(num_experts) {
  MG_REQUIRE(num_experts_ % ep_size() == 0, "--num-experts ", num_experts_,
             " is not divisible by --expert-model-parallel-size ", ep_size());
}

int64_t TokenDispatcher::Plan::expert_rows() const {
  int64_t n = 0;
  for (int64_t v : expert_counts) n += v;
  return n;
}

Tensor TokenDispatcher::gather_group(const Tensor& x) const {
  Tensor cur = x.contiguous();
  for (Communicator* c : {etp_.get(), ep_.get()}) {
    if (c == nullptr || c->size() == 1) continue;
    Tensor out = Tensor::empty({c->size() * cur.size(0), cur.size(1)}, cur.dtype(), cur.device());
    c->all_gather(cur, out);
    cur = out;
  }
  return cur;
}

Tensor TokenDispatcher::reduce_scatter_group(const Tensor& all, int64_t n) const {
  Tensor cur = all.contiguous();
  for (Communicator* c : {ep_.get(), etp_.get()}) {
    if (c == nullptr || c->size() == 1) continue;
    Tensor out = Tensor::empty({cur.size(0) / c->size(), cur.size(1)}, cur.dtype(), cur.device());
    c->reduce_scatter(cur, out);
    cur = out;
  }
  MG_CHECK(cur.size(0) == n, "reduce_scatter_group: ", cur.size(0), " rows for ", n, " tokens");
  return cur;
}

TokenDispatcher::Plan TokenDispatcher::plan(const Routing& r, Device device) const {
  const ops::profile::Scope profile("moe dispatch: plan");
  Plan p;
  p.num_tokens = r.num_tokens;
  const int P = ep_size(), T = tp_size(), L = local_experts(), E = num_experts_;
  if (local()) {
    p.local = local_.plan(r, device);
    p.expert_counts = p.local.counts;
    return p;
  }
  if (kind_ == DispatcherKind::allgather) {
    // The group's routing, gathered: probabilities and choices of every rank's tokens.
    const int64_t ne = r.num_tokens * E;
    Tensor mine = Tensor::empty({1, 2 * ne}, DType::F64);
    double* m = mine.data<double>();
    for (int64_t i = 0; i < ne; ++i) {
      m[i] = r.probs[size_t(i)];
      m[ne + i] = r.map[size_t(i)] ? 1.0 : 0.0;
    }
    const Tensor all = gather_group(mine);  // [P * T, 2 * ne]
    const int64_t Q = all.size(0);
    Routing g;
    g.num_tokens = Q * r.num_tokens;
    g.num_experts = L;
    g.probs.assign(size_t(g.num_tokens * L), 0.0);
    g.map.assign(size_t(g.num_tokens * L), 0);
    const double* a = all.data<double>();
    for (int64_t q = 0; q < Q; ++q)
      for (int64_t t = 0; t < r.num_tokens; ++t)
        for (int l = 0; l < L; ++l) {
          const int64_t src = q * 2 * ne + t * E + first_expert() + l;
          const size_t dst = size_t((q * r.num_tokens + t) * L + l);
          g.probs[dst] = a[src];
          g.map[dst] = a[src + ne] != 0.0;
        }
    p.local = local_.plan(g, device);
    p.expert_counts = p.local.counts;
    return p;
  }
  // alltoall: this rank's rows by expert; EP rank j's experts' rows go to EP rank j, then every TP
  // rank of an expert gathers what its TP peers received.
  p.local = local_.plan(r, device);
  p.send_rows.assign(size_t(P), 0);
  for (int e = 0; e < E; ++e) p.send_rows[size_t(e / L)] += p.local.counts[size_t(e)];
  // Every rank's counts per expert, [P * T, E] (row i * T + t: EP rank i, TP rank t).
  const Tensor all = gather_group(Tensor::from_vector(p.local.counts, {1, int64_t(E)}));
  const int64_t* c = all.data<int64_t>();
  auto count = [&](int t, int i, int l) { return c[(i * T + t) * E + first_expert() + l]; };
  p.recv_rows.assign(size_t(P), 0);
  p.tp_rows.assign(size_t(T), 0);
  p.expert_counts.assign(size_t(L), 0);
  std::vector<int64_t> block(size_t(T * P * L));  // first gathered row of (TP t, EP i, expert l)
  int64_t off = 0;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < P; ++i)
      for (int l = 0; l < L; ++l) {
        block[size_t((t * P + i) * L + l)] = off;
        off += count(t, i, l);
        if (t == tp_rank()) p.recv_rows[size_t(i)] += count(t, i, l);
        p.tp_rows[size_t(t)] += count(t, i, l);
        p.expert_counts[size_t(l)] += count(t, i, l);
      }
  // Megatron's sort_chunks_by_idxs: (TP rank, EP rank, expert) chunks into (expert, TP, EP) order.
  std::vector<int32_t> sort(static_cast<size_t>(off)), unsort(static_cast<size_t>(off));
  size_t s = 0;
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < P; ++i)
        for (int64_t k = 0; k < count(t, i, l); ++k, ++s) {
          sort[s] = int32_t(block[size_t((t * P + i) * L + l)] + k);
          unsort[size_t(sort[s])] = int32_t(s);
        }
  p.sort_index = rows_tensor(sort, device);
  p.unsort_index = rows_tensor(unsort, device);
  return p;
}

Tensor TokenDispatcher::to_experts(const Plan& p, const Tensor& rows) const {
  Tensor r = ep_size() > 1 ? exchange_rows(*ep_, rows, p.send_rows, p.recv_rows) : rows;
  if (tp_size() > 1) r = all_gather_rows(*etp_, r, p.tp_rows);
  return select_rows(r, p.sort_index, p.expert_rows());
}

Tensor TokenDispatcher::from_experts(const Plan& p, const Tensor& rows) const {
  Tensor r = select_rows(rows, p.unsort_index, p.expert_rows());
  if (tp_size() > 1) r = reduce_scatter_rows(*etp_, r, p.tp_rows);
  return ep_size() > 1 ? exchange_rows(*ep_, r, p.recv_rows, p.send_rows) : r;
}

Tensor TokenDispatcher::dispatch(const Plan& p, const Tensor& x) const {
  const ops::profile::Scope profile("moe dispatch: to experts");
  if (local()) return local_.dispatch(p.local, x);
  if (kind_ == DispatcherKind::alltoall) return to_experts(p, local_.dispatch(p.local, x));
  return local_.dispatch(p.local, gather_group(x));
}

void TokenDispatcher::dispatch_backward(const Plan& p, const Tensor& dxp, const Tensor& dx) const {
  const ops::profile::Scope profile("moe dispatch: to experts, bwd");
  if (local()) return local_.dispatch_backward(p.local, dxp, dx);
  if (kind_ == DispatcherKind::alltoall)
    return local_.dispatch_backward(p.local, from_experts(p, dxp), dx);
  Tensor all = Tensor::zeros({p.local.num_tokens, dx.size(1)}, DType::F32, dx.device());
  local_.dispatch_backward(p.local, dxp, all);
  ops::add(dx, dx, reduce_scatter_group(all, dx.size(0)));
}

Tensor TokenDispatcher::return_rows(const Plan& p, const Tensor& y) const {
  const ops::profile::Scope profile("moe dispatch: rows back");
  return !local() && kind_ == DispatcherKind::alltoall ? from_experts(p, y) : y;
}

Tensor TokenDispatcher::return_rows_backward(const Plan& p, const Tensor& dyr) const {
  const ops::profile::Scope profile("moe dispatch: rows back, bwd");
  return !local() && kind_ == DispatcherKind::alltoall ? to_experts(p, dyr) : dyr;
}

Tensor TokenDispatcher::combine(const Plan& p, const Tensor& yr) const {
  const ops::profile::Scope profile("moe combine");
  if (local() || kind_ == DispatcherKind::alltoall) return local_.combine(p.local, yr);
  // The group's tokens weighted by this rank's experts (partial sums over TP under SP).
  return reduce_scatter_group(local_.combine(p.local, yr), p.num_tokens);
}

Tensor TokenDispatcher::combine_backward(const Plan& p, const Tensor& dout, const Tensor& yr,
                                         std::vector<double>& dprobs) const {
  const ops::profile::Scope profile("moe combine, bwd");
  if (local() || kind_ == DispatcherKind::alltoall)
    return local_.combine_backward(p.local, dout, yr, dprobs);
  const int L = local_experts(), E = num_experts_;
  std::vector<double> local_dprobs;  // [Q * N, L]
  Tensor dy = local_.combine_backward(p.local, gather_group(dout), yr, local_dprobs);
  // Each token's probability gradients come from the ranks of its experts: summed back.
  const int64_t QN = p.local.num_tokens, N = p.num_tokens;
  Tensor spread = Tensor::zeros({QN, E}, DType::F64);
  double* s = spread.data<double>();
  for (int64_t t = 0; t < QN; ++t)
    for (int l = 0; l < L; ++l) s[t * E + first_expert() + l] = local_dprobs[size_t(t * L + l)];
  const Tensor mine = reduce_scatter_group(spread, N);
  dprobs.assign(mine.data<double>(), mine.data<double>() + N * E);
  return dy;
}

}  // namespace megatron::model
