// Collectives with known answers. Tests named Mpi* run at any world size: as plain processes
// (world of one, no MPI) and under `mpirun -np 2/4` (ctest label mpi). The timeout test launches
// its own 2-rank job in which rank 1 hangs, and checks that rank 0 fails with a clear message.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "comm/communicator.h"
#include "comm/parallel_state.h"
#include "comm/timed_communicator.h"
#include "test_util.h"

namespace megatron {
namespace {

std::shared_ptr<Communicator> world() { return world_communicator(); }

double sum_ranks(int n) { return n * (n - 1) / 2.0; }

template <typename T>
void check_all_reduce(DType dt) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  Tensor t = Tensor::empty({5}, DType::F32);
  for (int i = 0; i < 5; ++i) t.data<float>()[i] = float(r + i);
  Tensor x = t.to(dt);
  w->all_reduce(x, ReduceOp::Sum);
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(x.item_as_double(i), sum_ranks(n) + n * i) << dtype_name(dt);
  x = t.to(dt);
  w->all_reduce(x, ReduceOp::Max);
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(x.item_as_double(i), n - 1 + i) << dtype_name(dt);
  x = t.to(dt);
  w->all_reduce(x, ReduceOp::Min);
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(x.item_as_double(i), i) << dtype_name(dt);
}

TEST(MpiCommunicator, AllReduceSumMaxMinAllDtypes) {
  check_all_reduce<float>(DType::F32);
  check_all_reduce<double>(DType::F64);
  check_all_reduce<bf16>(DType::BF16);
  check_all_reduce<fp16>(DType::F16);
  // Integers (item_as_double covers float dtypes only: read them directly).
  auto w = world();
  Tensor a = Tensor::from_vector<int32_t>({w->rank(), -w->rank()}, {2});
  w->all_reduce(a, ReduceOp::Sum);
  EXPECT_EQ(a.data<int32_t>()[0], int32_t(sum_ranks(w->size())));
  EXPECT_EQ(a.data<int32_t>()[1], -int32_t(sum_ranks(w->size())));
  Tensor b = Tensor::from_vector<int64_t>({int64_t(w->rank()) << 40}, {1});
  w->all_reduce(b, ReduceOp::Max);
  EXPECT_EQ(b.data<int64_t>()[0], int64_t(w->size() - 1) << 40);
}

TEST(MpiCommunicator, HalfReductionRoundsOnceFromFp32) {
  // Rank 0 holds 1, the others 2^-9 (a quarter of bf16's spacing at 1). Adding in bf16 step by
  // step would stay at 1; the fp32 sum rounded once reaches 1 + 2^-7 with 4 ranks.
  auto w = world();
  const int n = w->size();
  Tensor y = Tensor::full({3}, w->rank() == 0 ? 1.0 : 1.0 / 512, DType::F32).to(DType::BF16);
  w->all_reduce(y);
  const double expect =
      Tensor::full({1}, 1.0 + (n - 1) / 512.0, DType::F32).to(DType::BF16).item_as_double(0);
  EXPECT_DOUBLE_EQ(y.item_as_double(2), expect);
  if (n == 4) {
    EXPECT_DOUBLE_EQ(expect, 1.0 + 1.0 / 128);
  }
}

TEST(MpiCommunicator, AllGatherAndReduceScatter) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  Tensor in = Tensor::full({2, 3}, double(r), DType::F32);
  Tensor out = Tensor::empty({2 * n, 3}, DType::F32);
  w->all_gather(in, out);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out.item_as_double(q * 6 + i), q);
  // reduce_scatter: slot q of rank r holds r + q -> rank r receives sum_p (p + r).
  Tensor rs_in = Tensor::empty({n, 4}, DType::BF16);
  for (int q = 0; q < n; ++q) rs_in[q].fill_(double(r + q));
  Tensor rs_out = Tensor::empty({4}, DType::BF16);
  w->reduce_scatter(rs_in, rs_out, ReduceOp::Sum);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rs_out.item_as_double(i), sum_ranks(n) + double(n) * r);
  Tensor bad = Tensor::empty({3}, DType::F32);
  if (n > 1) {
    EXPECT_THROW(w->all_gather(in, bad), InternalError);
  }
}

// In place: slice r of the buffer is rank r's input; every other slice is overwritten. Over MPI
// (MPI_IN_PLACE), through the timing decorator (which counts one slice as the input bytes), and
// through the base-class fallback (the self communicator, which copies the slice out).
void check_all_gather_inplace(Communicator& c, DType dt) {
  const int r = c.rank(), n = c.size();
  Tensor buf = Tensor::full({n * 5}, -1.0, DType::F32);
  for (int i = 0; i < 5; ++i) buf.data<float>()[r * 5 + i] = float(10 * r + i);
  Tensor x = buf.to(dt);
  CommHandle h = c.all_gather_inplace_async(x);
  h.wait();
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 5; ++i) EXPECT_EQ(x.item_as_double(q * 5 + i), 10 * q + i) << dtype_name(dt);
}

TEST(MpiCommunicator, AllGatherInPlace) {
  auto w = world();
  check_all_gather_inplace(*w, DType::F32);
  check_all_gather_inplace(*w, DType::BF16);
  auto stats = std::make_shared<CommStats>();
  auto timed = make_timed_communicator(w, stats);
  check_all_gather_inplace(*timed, DType::F32);
  EXPECT_EQ(stats->calls, 1);
  EXPECT_EQ(stats->bytes, 5 * 4);
  check_all_gather_inplace(*make_self_communicator(), DType::F32);
  if (w->size() > 1) {
    Tensor odd = Tensor::empty({w->size() * 5 + 1}, DType::F32);
    EXPECT_THROW(w->all_gather_inplace(odd), InternalError);
  }
}

TEST(MpiCommunicator, BroadcastSendRecvBarrierAndAsyncOverlap) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  Tensor t = Tensor::full({4}, r == n - 1 ? 7.0 : -1.0, DType::F32);
  w->broadcast(t, n - 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.item_as_double(i), 7.0);
  if (n > 1) {  // ring: send rank id to the right, receive from the left
    Tensor s = Tensor::from_vector<int64_t>({r, 100 + r}, {2});
    Tensor got = Tensor::zeros({2}, DType::I64);
    CommHandle hr = w->recv_async(got, (r + n - 1) % n, 5);
    CommHandle hs = w->send_async(s, (r + 1) % n, 5);
    hs.wait();
    hr.wait();
    EXPECT_EQ(got.data<int64_t>()[0], (r + n - 1) % n);
    EXPECT_EQ(got.data<int64_t>()[1], 100 + (r + n - 1) % n);
  }
  // Two collectives in flight at once, waited in reverse order.
  Tensor a = Tensor::full({1000}, 1.0, DType::F32), b = Tensor::full({10}, double(r), DType::F32);
  CommHandle ha = w->all_reduce_async(a, ReduceOp::Sum);
  CommHandle hb = w->all_reduce_async(b, ReduceOp::Max);
  hb.wait();
  ha.wait();
  ha.wait();
  EXPECT_EQ(a.item_as_double(999), n);
  EXPECT_EQ(b.item_as_double(0), n - 1);
  w->barrier();
}

TEST(MpiCommunicator, SplitGroupsAndParallelState) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  auto even_odd = w->split(r % 2, r, "parity");
  ASSERT_NE(even_odd, nullptr);
  EXPECT_EQ(even_odd->size(), (n - r % 2 + 1) / 2);
  EXPECT_EQ(even_odd->world_ranks()[size_t(even_odd->rank())], r);
  Tensor x = Tensor::full({1}, double(r), DType::F32);
  even_odd->all_reduce(x);
  double expect = 0;
  for (int q = r % 2; q < n; q += 2) expect += q;
  EXPECT_EQ(x.item_as_double(0), expect);
  EXPECT_EQ(w->split(r == 0 ? -1 : 0, 0, "not0") == nullptr, r == 0);

  ParallelConfig c;
  c.tensor_model_parallel_size = n % 2 == 0 ? 2 : 1;
  c.pipeline_model_parallel_size = n % 4 == 0 ? 2 : 1;
  auto ps = ParallelState::create(w, c);
  const auto& L = ps.layout();
  for (size_t k = 0; k < size_t(GroupKind::kCount); ++k) {
    const auto kind = GroupKind(k);
    if (!ps.has_group(kind)) {
      EXPECT_TRUE(L.group_of(kind, r).empty());
      continue;
    }
    EXPECT_EQ(ps.group(kind).world_ranks(), L.group_of(kind, r)) << group_kind_name(kind);
    Tensor one = Tensor::full({1}, 1.0, DType::F32);
    ps.group(kind).all_reduce(one);
    EXPECT_EQ(one.item_as_double(0), double(L.group_of(kind, r).size()));
  }
  EXPECT_EQ(ps.tp().rank(), ps.tp_rank());
  EXPECT_EQ(ps.world_rank(), ps.tp_rank() + ps.tp_size() * (ps.dp_rank() + ps.dp_size() * ps.pp_rank()));
}

// all_to_all_v with uneven pieces, empty ones, a rank that sends nothing (the last) and one that
// receives nothing (rank 0, when there are two or more): element k of the piece from rank i to
// rank j is 16 i + 4 j + k (exact in bf16).
int64_t piece_count(int from, int to, int n) {
  if (n > 1 && (from == n - 1 || to == 0)) return 0;
  return (from + 2 * to + 1) % 4;
}

TEST(MpiCommunicator, AllToAllVUnevenAndEmptyPieces) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  for (DType dt : {DType::F32, DType::BF16}) {
    std::vector<int64_t> sc, rc;
    std::vector<float> send, want;
    for (int j = 0; j < n; ++j) {
      sc.push_back(piece_count(r, j, n));
      for (int64_t k = 0; k < sc.back(); ++k) send.push_back(float(16 * r + 4 * j + k));
      rc.push_back(piece_count(j, r, n));
      for (int64_t k = 0; k < rc.back(); ++k) want.push_back(float(16 * j + 4 * r + k));
    }
    const Tensor in = Tensor::from_vector(send, {int64_t(send.size())}).to(dt);
    Tensor out = Tensor::full({int64_t(want.size())}, -1.0, dt);
    w->all_to_all_v(in, sc, out, rc);
    const Tensor got = out.to(DType::F32);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got.data<float>()[i], want[i]) << dtype_name(dt) << " element " << i;
    if (n > 1 && r == 0) {
      EXPECT_EQ(out.numel(), 0);
    }
    if (n > 1 && r == n - 1) {
      EXPECT_EQ(in.numel(), 0);
    }
  }
  // 64-bit integers (the counts the expert dispatcher exchanges).
  std::vector<int64_t> ones(size_t(n), 1);
  Tensor ids = Tensor::empty({n}, DType::I64), got_ids = Tensor::empty({n}, DType::I64);
  for (int j = 0; j < n; ++j) ids.data<int64_t>()[j] = (int64_t(r) << 40) + j;
  w->all_to_all_v(ids, ones, got_ids, ones);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got_ids.data<int64_t>()[i], (int64_t(i) << 40) + r);
  // Equal pieces: rank i's slice j lands in slice i of rank j.
  Tensor in = Tensor::empty({n, 3}, DType::F32), out = Tensor::empty({n, 3}, DType::F32);
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < 3; ++k) in.data<float>()[j * 3 + k] = float(10 * r + j + 0.5 * k);
  w->all_to_all_async(in, out).wait();
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(out.data<float>()[i * 3 + k], float(10 * i + r + 0.5 * k));
  // Counts that do not match the tensors are a caller's bug, refused before anything is sent.
  std::vector<int64_t> bad(size_t(n), 2);
  Tensor one = Tensor::empty({1}, DType::F32);
  EXPECT_THROW(w->all_to_all_v(one, bad, one, bad), InternalError);
  const std::vector<int64_t> too_many(size_t(n + 1), 0);
  EXPECT_THROW(w->all_to_all_v(one, too_many, one, too_many), InternalError);
  bad.assign(size_t(n), 0);
  bad[0] = -1;
  EXPECT_THROW(w->all_to_all_v(one, bad, one, bad), InternalError);
}

// The timed wrapper counts an all-to-all's input bytes and forwards it.
TEST(MpiCommunicator, TimedAllToAll) {
  auto stats = std::make_shared<CommStats>();
  auto t = make_timed_communicator(world(), stats);
  const int n = t->size();
  Tensor in = Tensor::full({2 * n}, double(t->rank()), DType::F32);
  Tensor out = Tensor::empty({2 * n}, DType::F32);
  t->all_to_all(in, out);
  EXPECT_EQ(stats->calls, 1);
  EXPECT_EQ(stats->bytes, 8 * n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out.data<float>()[2 * i + 1], float(i));
}

// Child of the timeout test: runs only inside the 2-rank job that test launches.
TEST(MpiTimeoutChild, RankOneHangs) {
  const char* mode = std::getenv("MG_COMM_TIMEOUT_CHILD");
  if (!mode) GTEST_SKIP() << "runs inside CommTimeout only";
  CommOptions o;
  o.timeout_seconds = 2.0;
  auto w = world_communicator(o);
  if (w->rank() == 1) {
    if (std::string(mode) == "exit") std::_Exit(3);  // dies without a word
    std::this_thread::sleep_for(std::chrono::seconds(60));  // hangs; the abort kills it
    return;
  }
  Tensor t = Tensor::full({4}, 1.0, DType::F32);
  w->all_reduce(t);
  FAIL() << "all_reduce with a hung peer returned";
}

testing::CommandResult run_child(const std::string& mode) {
  return testing::run_command(
      "MG_COMM_TIMEOUT_CHILD=" + mode + " mpirun --oversubscribe --allow-run-as-root "
      "-x MG_COMM_TIMEOUT_CHILD -np 2 " + std::filesystem::read_symlink("/proc/self/exe").string() +
      " --gtest_filter=MpiTimeoutChild.* 2>&1");
}

TEST(CommTimeout, DeadRankFailsTheJob) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const auto start = std::chrono::steady_clock::now();
  const auto res = run_child("exit");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(res.exit_code, 0) << res.output;
  EXPECT_LT(secs, 30.0) << res.output;
}

TEST(CommTimeout, HungRankMakesOthersFailWithClearMessage) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const auto start = std::chrono::steady_clock::now();
  const auto res = testing::run_command(
      "MG_COMM_TIMEOUT_CHILD=hang mpirun --oversubscribe --allow-run-as-root -x MG_COMM_TIMEOUT_CHILD "
      "-np 2 " + std::filesystem::read_symlink("/proc/self/exe").string() + " --gtest_filter=MpiTimeoutChild.* 2>&1");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(res.exit_code, 0) << res.output;
  EXPECT_NE(res.output.find("error: distributed timeout: all_reduce(sum) on group 'world' "
                            "(world ranks [0,1]) did not complete within 2 s on world rank 0"),
            std::string::npos)
      << res.output;
  EXPECT_NE(res.output.find("--distributed-timeout-minutes"), std::string::npos);
  EXPECT_LT(secs, 30.0);
}

}  // namespace
}  // namespace megatron

namespace megatron {
namespace {
TEST(CommOptions, FromTimeoutMinutes) {
  EXPECT_DOUBLE_EQ(CommOptions::from_timeout_minutes(10).timeout_seconds, 600.0);
  EXPECT_DOUBLE_EQ(CommOptions::from_timeout_minutes(0.5).timeout_seconds, 30.0);
  EXPECT_THROW(CommOptions::from_timeout_minutes(0), Error);
}
}  // namespace
}  // namespace megatron
