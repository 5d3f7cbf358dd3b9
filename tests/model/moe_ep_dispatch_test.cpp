// The expert-parallel token dispatchers (model/moe/token_dispatcher.h) on constructed routings,
// against the answer computed on one rank in double precision: each expert e multiplies its rows
// by (e + 1), so out[t] = sum_e p[t, e] (e + 1) x[t], dx[t] = sum_e p[t, e] (e + 1) dout[t] and
// dprobs[t, e] = (e + 1) <dout[t], x[t]>. Every rank routes its tokens over all experts; the
// routing sends nothing to rank 0's experts (a rank that receives no rows), and the last rank's
// tokens all go to its own experts (a rank that sends nothing to the others). Mpi* tests run at
// any world size: one process (the local dispatcher) and mpirun -np 2 / 4 (label mpi). Over an
// expert tensor-parallel group of 2 (the world at -np 2, EP2 x ETP2 at -np 4) every rank routes
// tokens of its own and each expert's shard returns 1/2 of its output and input gradient: the
// dispatcher's reduce-scatters must sum the shards to the same answer.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/communicator.h"
#include "kernels/ops.h"
#include "model/moe/token_dispatcher.h"

namespace megatron::model {
namespace {

constexpr int kLocalExperts = 2;
constexpr int64_t kTokens = 5, kHidden = 3;

double token_value(int rank, int64_t t, int64_t j) { return 0.1 * rank + 0.37 * double(t) - 0.2 * double(j) + 0.05; }
double grad_value(int rank, int64_t t, int64_t j) { return 0.3 - 0.11 * rank + 0.07 * double(t * kHidden + j); }

// Rank `rank` of P: top-2 routing with probabilities 0.7 / 0.3 (top-1 for every third token).
Routing constructed_routing(int rank, int P) {
  const int E = kLocalExperts * P;
  Routing r;
  r.num_tokens = kTokens;
  r.num_experts = E;
  r.probs.assign(size_t(kTokens * E), 0.0);
  r.map.assign(size_t(kTokens * E), 0);
  for (int64_t t = 0; t < kTokens; ++t) {
    int a, b;
    if (P > 1 && rank == P - 1) {  // its own experts only
      a = kLocalExperts * rank;
      b = a + 1;
    } else if (P > 1) {  // never rank 0's experts
      a = kLocalExperts + int((t + rank) % (E - kLocalExperts));
      b = kLocalExperts + int((t + rank + 1) % (E - kLocalExperts));
    } else {
      a = int(t % E);
      b = int((t + 1) % E);
    }
    const bool top1 = t % 3 == 2;
    r.map[size_t(t * E + a)] = 1;
    r.probs[size_t(t * E + a)] = top1 ? 1.0 : 0.7;
    if (!top1) {
      r.map[size_t(t * E + b)] = 1;
      r.probs[size_t(t * E + b)] = 0.3;
    }
  }
  return r;
}

// The experts: rows of local expert l (global first + l) times (first + l + 1) / shards, in place
// of MLPs (a shard's partial sum).
Tensor run_experts(const Tensor& rows, const std::vector<int64_t>& counts, int first, int shards = 1) {
  Tensor out = Tensor::empty({rows.size(0), kHidden}, DType::F32);
  const Tensor in = rows.to(DType::F32);
  int64_t off = 0;
  for (size_t l = 0; l < counts.size(); ++l)
    for (int64_t i = 0; i < counts[l]; ++i, ++off)
      for (int64_t j = 0; j < kHidden; ++j)
        out.data<float>()[off * kHidden + j] =
            in.data<float>()[off * kHidden + j] * float(first + int(l) + 1) / float(shards);
  EXPECT_EQ(off, rows.size(0));
  return out;
}

// The world as EP x T ranks (T, the experts' tensor-parallel size, fastest).
void check_dispatcher(DispatcherKind kind, int T = 1) {
  auto world = world_communicator();
  if (world->size() % T != 0 || (T > 1 && world->size() == 1))
    GTEST_SKIP() << "needs mpirun -np 2 or 4 (label mpi)";
  const int rank = world->rank(), P = world->size() / T, q = rank / T, E = kLocalExperts * P;
  std::shared_ptr<Communicator> ep = T == 1 ? world : world->split(rank % T, q, "ep");
  std::shared_ptr<Communicator> etp = T == 1 ? nullptr : world->split(q, rank % T, "etp");
  const TokenDispatcher d(kind, P > 1 ? ep : nullptr, E, etp);
  EXPECT_EQ(d.local_experts(), kLocalExperts);
  EXPECT_EQ(d.first_expert(), kLocalExperts * q);
  const Routing r = constructed_routing(q, P);
  Tensor x = Tensor::empty({kTokens, kHidden}, DType::F32);
  Tensor dout = Tensor::empty({kTokens, kHidden}, DType::F32);
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t j = 0; j < kHidden; ++j) {
      x.data<float>()[t * kHidden + j] = float(token_value(rank, t, j));
      dout.data<float>()[t * kHidden + j] = float(grad_value(rank, t, j));
    }

  const TokenDispatcher::Plan plan = d.plan(r, Device::cpu());
  ASSERT_EQ(plan.expert_counts.size(), size_t(kLocalExperts));
  if (P > 1 && q == 0) {
    EXPECT_EQ(plan.expert_rows(), 0) << "rank 0's experts are sent nothing";
  }
  const Tensor xp = d.dispatch(plan, x);
  EXPECT_EQ(xp.size(0), plan.expert_rows());
  const Tensor yr = d.return_rows(plan, run_experts(xp, plan.expert_counts, d.first_expert(), T));
  const Tensor out = d.combine(plan, yr);
  std::vector<double> dprobs;
  const Tensor dyr = d.combine_backward(plan, dout, yr, dprobs);
  const Tensor dy = d.return_rows_backward(plan, dyr);
  Tensor dx = Tensor::zeros({kTokens, kHidden}, DType::F32);
  d.dispatch_backward(plan, run_experts(dy, plan.expert_counts, d.first_expert(), T), dx);

  ASSERT_EQ(dprobs.size(), size_t(kTokens * E));
  for (int64_t t = 0; t < kTokens; ++t) {
    double dot = 0;
    for (int64_t j = 0; j < kHidden; ++j) dot += token_value(rank, t, j) * grad_value(rank, t, j);
    for (int64_t j = 0; j < kHidden; ++j) {
      double want_out = 0, want_dx = 0;
      for (int e = 0; e < E; ++e) {
        const double p = r.probs[size_t(t * E + e)];
        want_out += p * (e + 1) * token_value(rank, t, j);
        want_dx += p * (e + 1) * grad_value(rank, t, j);
      }
      EXPECT_NEAR(out.data<float>()[t * kHidden + j], want_out, 1e-5) << "token " << t;
      EXPECT_NEAR(dx.data<float>()[t * kHidden + j], want_dx, 1e-5) << "token " << t;
    }
    for (int e = 0; e < E; ++e) {
      const double want = r.map[size_t(t * E + e)] ? (e + 1) * dot : 0.0;
      EXPECT_NEAR(dprobs[size_t(t * E + e)], want, 1e-5) << "token " << t << " expert " << e;
    }
  }
}

TEST(MpiMoeDispatch, AllToAllMatchesTheSingleRankAnswer) { check_dispatcher(DispatcherKind::alltoall); }

TEST(MpiMoeDispatch, AllGatherMatchesTheSingleRankAnswer) { check_dispatcher(DispatcherKind::allgather); }

TEST(MpiMoeDispatch, AllToAllOverExpertTensorParallelMatchesTheSingleRankAnswer) {
  check_dispatcher(DispatcherKind::alltoall, 2);
}

TEST(MpiMoeDispatch, AllGatherOverExpertTensorParallelMatchesTheSingleRankAnswer) {
  check_dispatcher(DispatcherKind::allgather, 2);
}

TEST(MoeDispatch, KindsByName) {
  EXPECT_EQ(parse_dispatcher_kind("alltoall"), DispatcherKind::alltoall);
  EXPECT_EQ(parse_dispatcher_kind("allgather"), DispatcherKind::allgather);
  try {
    parse_dispatcher_kind("flex");
    ADD_FAILURE() << "flex accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flex (DeepEP) is not built"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_dispatcher_kind("all2all"), Error);
}

}  // namespace
}  // namespace megatron::model
