// `megatron launch`: runs a subcommand on N ranks under mpirun, taking torchrun's flags in both
// spellings (mapped onto mpirun: checked through --dry-run's command line); bad input, and what
// cannot be mapped, gets a clear error.
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
  EXPECT_NE(res.output.find("launch needs the command to run"), std::string::npos) << res.output;
  res = testing::run_cli("launch --nproc-per-node 2 --hostfile /nonexistent/hosts -- version 2>&1");
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.output.find("--hostfile /nonexistent/hosts: no such file"), std::string::npos)
      << res.output;
  res = testing::run_cli("launch --nproc-per-node 2 --mpirun /nonexistent/mpirun -- version 2>&1");
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.output.find("cannot run '/nonexistent/mpirun'"), std::string::npos) << res.output;
}

// torchrun's launcher lines of Megatron's scripts, with the launcher renamed and no '--'.
TEST(Launch, RunsTorchrunLinesOnTwoRanks) {
  if (launched_under_mpi()) GTEST_SKIP() << "launches its own job";
  const auto res = testing::run_cli(
      "launch --nproc_per_node 2 --nnodes 1 --node_rank 0 --master_addr localhost --master_port 6000 "
      "version 2>&1");
  EXPECT_EQ(res.exit_code, 0) << res.output;
  EXPECT_EQ(count(res.output, "megatron.cpp " MEGATRON_VERSION), 2u) << res.output;
}

struct DryRun {
  int exit_code;
  std::string output;
};
DryRun dry_run(const std::string& args) {
  const auto r = testing::run_cli("launch --dry-run " + args + " 2>&1");
  return {r.exit_code, r.output};
}

TEST(Launch, TakesTorchrunFlagsInBothSpellings) {
  if (launched_under_mpi()) GTEST_SKIP() << "checks that it is not inside an MPI job";
  const std::string self = testing::cli_path().string();
  auto r = dry_run("--nproc_per_node 2 --nnodes 1 --node_rank 0 --master_addr localhost "
                   "--master_port 6000 -- version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" -np 2 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(self + " version\n"), std::string::npos) << r.output;
  r = dry_run("--nproc-per-node 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 6000 "
              "--rdzv-backend c10d --rdzv-endpoint localhost:29400 --rdzv-id job1 --standalone "
              "--max-restarts 0 --log-dir /tmp/logs version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" -np 2 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--output-filename /tmp/logs"), std::string::npos) << r.output;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  r = dry_run("--nproc_per_node auto version");
  EXPECT_NE(r.output.find(" -np " + std::to_string(cores) + " "), std::string::npos) << r.output;
  // Megatron's script names run the matching command.
  const std::pair<const char*, const char*> scripts[] = {
      {"pretrain_gpt.py", "pretrain-gpt"}, {"tasks/main.py", "evaluate"},
      {"tools/run_text_generation_server.py", "serve"}, {"tools/preprocess_data.py", "preprocess-data"}};
  for (const auto& [script, command] : scripts) {
    r = dry_run(std::string("--nproc_per_node 2 ") + script + " --num-layers 2 --fp16");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(self + " " + command + " --num-layers 2 --fp16\n"), std::string::npos)
        << r.output;
  }
  r = dry_run("--nproc_per_node 2 train_bert.py --num-layers 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: launch runs megatron commands; the Python script 'train_bert.py'"),
            std::string::npos) << r.output;
}

TEST(Launch, SeveralNodesMapOntoTheHostfile) {
  if (launched_under_mpi()) GTEST_SKIP() << "checks that it is not inside an MPI job";
  testing::TempDir tmp;
  const std::string hosts = (tmp / "hosts").string();
  testing::write_file(hosts, "# the cluster\nnodeA slots=2\nnodeB slots=2  # second\n\nnodeC\n");
  // The master node first (rank 0 runs there, as torchrun's node 0), then the others in order.
  auto r = dry_run("--nproc_per_node 2 --nnodes 2 --node_rank 0 --master_addr nodeB "
                   "--master_port 6000 --hostfile " + hosts + " version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" -np 4 --host nodeB:2,nodeA:2 --npernode 2 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("-x OMP_NUM_THREADS"), std::string::npos) << r.output;
  r = dry_run("--nproc_per_node 2 --nnodes 3 --hostfile " + hosts + " version");
  EXPECT_NE(r.output.find(" -np 6 --host nodeA:2,nodeB:2,nodeC:2 "), std::string::npos) << r.output;
  // The launch on another node has nothing to start: mpirun on node 0 starts its ranks.
  r = dry_run("--nproc_per_node 2 --nnodes 2 --node_rank 1 --master_addr nodeA version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to start here"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" -np "), std::string::npos) << r.output;
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"--nproc_per_node 2 --nnodes 2 --master_addr nodeA version", "pass --hostfile FILE"},
      {"--nproc_per_node 2 --nnodes 4 --hostfile " + hosts + " version", "fewer than --nnodes 4"},
      {"--nproc_per_node 2 --nnodes 2 --master_addr nodeZ --hostfile " + hosts + " version",
       "--master-addr nodeZ is not in --hostfile"},
      {"--nproc_per_node 2 --nnodes 1:2 version", "elastic node range"},
      {"--nproc_per_node 2 --max_restarts 3 version", "mpirun does not restart"},
      {"--nproc_per_node gpu version", "--nproc-per-node gpu"},
      {"--nproc_per_node two version", "--nproc-per-node must be a number"},
      {"--nproc_per_node 2 --nnodes 2 --standalone version", "--standalone is a single-node job"},
      {"--nproc_per_node 2 --nnodes 2 --node_rank 2 version", "--node-rank 2 must be in [0, --nnodes 2)"},
  };
  for (const auto& c : cases) {
    r = dry_run(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron
