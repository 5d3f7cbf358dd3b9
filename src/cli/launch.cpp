// `megatron launch --nproc-per-node N [--hostfile F] -- <subcommand args...>`: starts N copies of
// this binary under mpirun (the torchrun of this project). A thin wrapper: it builds the mpirun
// command line and execs it, so mpirun's exit status is the job's. Adds --allow-run-as-root when
// running as root and --oversubscribe when N exceeds this machine's cores (local runs only).
// Threads: Open MPI binds each rank to one core by default (np <= 2), which would squeeze a
// rank's OpenMP threads onto that core, so launch passes --bind-to none; and, like torchrun, it
// sets OMP_NUM_THREADS when the environment does not: this machine's cores / N (at least 1) for
// local runs, 1 per rank with a hostfile. A value already set is forwarded to every rank.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"

namespace megatron::cli {
namespace {

struct LaunchOptions {
  int nproc_per_node = 1;
  std::string hostfile;
  std::string mpirun = "mpirun";
  std::vector<std::string> args;
};

std::vector<std::string> build_command(const LaunchOptions& o) {
  MG_REQUIRE(o.nproc_per_node >= 1, "--nproc-per-node must be >= 1, got ", o.nproc_per_node);
  MG_REQUIRE(!o.args.empty(), "launch needs the command to run after '--', e.g. "
             "`megatron launch --nproc-per-node 2 -- pretrain-gpt ...`");
  MG_REQUIRE(o.args.front() != "launch", "launch cannot launch itself");
  MG_REQUIRE(!launched_under_mpi(), "launch was started inside an MPI job; run it directly, "
             "not under mpirun");
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  MG_REQUIRE(!ec, "cannot find the path of the megatron binary (/proc/self/exe): ", ec.message());
  std::vector<std::string> cmd = {o.mpirun};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  const unsigned cores = std::thread::hardware_concurrency();
  if (std::getenv("OMP_NUM_THREADS") != nullptr) {
    cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS"});
  } else {
    const unsigned per_rank =
        o.hostfile.empty() ? std::max(1u, cores / unsigned(o.nproc_per_node)) : 1u;
    cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(per_rank)});
  }
  if (!o.hostfile.empty()) {
    MG_REQUIRE(std::filesystem::is_regular_file(o.hostfile), "--hostfile ", o.hostfile,
               ": no such file");
    cmd.insert(cmd.end(), {"--hostfile", o.hostfile, "--npernode", std::to_string(o.nproc_per_node)});
  } else {
    if (cores == 0 || unsigned(o.nproc_per_node) > cores) cmd.push_back("--oversubscribe");
    cmd.insert(cmd.end(), {"-np", std::to_string(o.nproc_per_node)});
  }
  cmd.push_back(self.string());
  cmd.insert(cmd.end(), o.args.begin(), o.args.end());
  return cmd;
}

CommandRegistrar reg("launch", "Run a command on several processes (ranks) under mpirun", 900,
                     [](CLI::App& sub) {
  auto o = std::make_shared<LaunchOptions>();
  sub.add_option("--nproc-per-node", o->nproc_per_node, "Processes (ranks) per node")->required();
  sub.add_option("--hostfile", o->hostfile,
                 "MPI hostfile for multi-node runs (--nproc-per-node ranks on each host)");
  sub.add_option("--mpirun", o->mpirun, "The mpirun executable")->capture_default_str();
  sub.add_option("args", o->args, "The megatron subcommand and its flags, after '--'");
  sub.callback([o] {
    const auto cmd = build_command(*o);
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
    log_info("launch: ", line);
    std::vector<char*> argv;
    for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(stdout);
    execvp(argv[0], argv.data());
    MG_THROW("cannot run '", o->mpirun, "': ", std::strerror(errno),
             " (install Open MPI, or pass its path with --mpirun)");
  });
});

}  // namespace
}  // namespace megatron::cli
