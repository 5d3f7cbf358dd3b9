// `megatron launch`: runs a subcommand on N ranks under mpirun; bad input gets a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "comm/communicator.h"
#include "test_util.h"

namespace megatron {
namespace {

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST(Launch, RunsVersionOnTwoRanks) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const auto res = testing::run_cli("launch --nproc-per-node 2 -- version 2>&1");
  EXPECT_EQ(res.exit_code, 0) << res.output;
  EXPECT_EQ(count(res.output, "megatron.cpp " MEGATRON_VERSION), 2u) << res.output;
  EXPECT_NE(res.output.find("-np 2"), std::string::npos) << res.output;
}

// Threads: no core binding (a rank's OpenMP threads would share one core), and OMP_NUM_THREADS
// set from this machine's cores when unset, forwarded when set.
TEST(Launch, SetsThreadsAndNoBinding) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const std::string cli = "'" + testing::cli_path().string() + "' ";
  auto res = testing::run_command("env -u OMP_NUM_THREADS " + cli + "launch --nproc-per-node 2 -- version 2>&1");
  EXPECT_EQ(res.exit_code, 0) << res.output;
  EXPECT_NE(res.output.find("--bind-to none"), std::string::npos) << res.output;
  const unsigned cores = std::thread::hardware_concurrency();
  EXPECT_NE(res.output.find("-x OMP_NUM_THREADS=" + std::to_string(std::max(1u, cores / 2))),
            std::string::npos) << res.output;
  res = testing::run_command("OMP_NUM_THREADS=3 " + cli + "launch --nproc-per-node 2 -- version 2>&1");
  EXPECT_EQ(res.exit_code, 0) << res.output;
  EXPECT_NE(res.output.find("-x OMP_NUM_THREADS "), std::string::npos) << res.output;  // forwarded as is
}

TEST(Launch, FailingRankFailsTheJob) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const auto res = testing::run_cli("launch --nproc-per-node 2 -- no-such-command 2>&1");
  EXPECT_NE(res.exit_code, 0) << res.output;
}

TEST(Launch, RejectsBadArguments) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  auto res = testing::run_cli("launch --nproc-per-node 0 -- version 2>&1");
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.output.find("error: --nproc-per-node must be >= 1"), std::string::npos) << res.output;
  res = testing::run_cli("launch --nproc-per-node 2 2>&1");
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.output.find("after '--'"), std::string::npos) << res.output;
  res = testing::run_cli("launch --nproc-per-node 2 --hostfile /nonexistent/hosts -- version 2>&1");
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.output.find("--hostfile /nonexistent/hosts: no such file"), std::string::npos)
      << res.output;
  res = testing::run_cli("launch --nproc-per-node 2 --mpirun /nonexistent/mpirun -- version 2>&1");
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.output.find("cannot run '/nonexistent/mpirun'"), std::string::npos) << res.output;
}

}  // namespace
}  // namespace megatron
