// `megatron launch [torchrun flags] [--hostfile F] [--] <subcommand args...>`: starts the ranks of
// a job under mpirun (the torchrun of this project). A thin wrapper: it builds the mpirun command
// line and execs it, so mpirun's exit status is the job's. Adds --allow-run-as-root when running
// as root and --oversubscribe when the ranks exceed this machine's cores (local runs only).
//
// torchrun's flags are taken in both spellings (--nproc_per_node / --nproc-per-node, --nnodes,
// --node_rank, --master_addr, --master_port, --rdzv_endpoint, --rdzv_backend, --rdzv_id,
// --standalone, --max_restarts, --log_dir) and mapped onto mpirun:
//   - one node: -np nproc-per-node on this machine (mpirun wires the ranks up itself, so the
//     master address and port are not needed);
//   - --nnodes N > 1: torchrun runs one launcher per node, which meet at --master_addr; mpirun
//     starts every node's ranks from one launch, and needs the nodes' names: they come from
//     --hostfile (its first N hosts, the --master_addr host first, so that rank 0 runs there as
//     under torchrun), --npernode nproc-per-node. Launch on node 0 only; on another node
//     (--node_rank > 0) launch says so and exits 0, so a script run on every node still works;
//   - --log_dir DIR: mpirun --output-filename DIR (one output file per rank).
// What cannot be mapped (an elastic --nnodes MIN:MAX, --max_restarts > 0, --nproc_per_node gpu
// in a build without a GPU backend) is an error naming the flag. The command may be a Megatron
// script name (pretrain_gpt.py, tasks/main.py, tools/run_text_generation_server.py, ...), which
// runs the matching subcommand.
//
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
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_errors.h"
#include "cli/command.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"

namespace megatron::cli {
namespace {

struct LaunchOptions {
  std::string nproc_per_node = "1";  // a number, or torchrun's "auto" / "cpu" / "gpu"
  std::string nnodes = "1";          // N or MIN:MAX
  int node_rank = 0;
  std::string master_addr;           // default 127.0.0.1 (torchrun's)
  int master_port = 29500;
  std::string rdzv_backend = "static", rdzv_endpoint, rdzv_id = "none", rdzv_conf;
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;
  std::string hostfile;
  std::string mpirun = "mpirun";
  bool dry_run = false;
  std::vector<std::string> args;
  CLI::App* app = nullptr;
};

bool given(const LaunchOptions& o, const std::string& flag) {
  const CLI::Option* opt = o.app == nullptr ? nullptr : o.app->get_option_no_throw(flag);
  return opt != nullptr && opt->count() > 0;
}

int parse_nproc(const std::string& v, unsigned cores) {
  if (v == "auto" || v == "cpu") return int(std::max(1u, cores));
  MG_REQUIRE(v != "gpu", "--nproc-per-node gpu: this build runs its ranks on the CPU; give a "
             "number of processes (or cpu)");
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  MG_REQUIRE(!v.empty() && end == v.c_str() + v.size(), "--nproc-per-node must be a number, auto, "
             "cpu or gpu, got '", v, "'");
  MG_REQUIRE(n >= 1, "--nproc-per-node must be >= 1, got ", n);
  return int(n);
}

int parse_nnodes(const std::string& v) {
  const size_t colon = v.find(':');
  auto number = [&](const std::string& s) {
    char* end = nullptr;
    const long n = std::strtol(s.c_str(), &end, 10);
    MG_REQUIRE(!s.empty() && end == s.c_str() + s.size() && n >= 1,
               "--nnodes must be a number >= 1 (or MIN:MAX), got '", v, "'");
    return int(n);
  };
  if (colon == std::string::npos) return number(v);
  const int lo = number(v.substr(0, colon)), hi = number(v.substr(colon + 1));
  MG_REQUIRE(lo == hi, "--nnodes ", v, ": an elastic node range cannot be mapped onto mpirun, "
             "which starts a fixed set of ranks; give one number");
  return lo;
}

bool is_local_host(const std::string& h) {
  if (h.empty() || h == "localhost" || h.rfind("127.", 0) == 0 || h == "::1") return true;
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 && h == name;
}

// The hosts of an Open MPI hostfile ("host [slots=N] ..." per line, '#' comments), in order.
std::vector<std::string> read_hostfile(const std::string& path) {
  MG_REQUIRE(std::filesystem::is_regular_file(path), "--hostfile ", path, ": no such file");
  std::ifstream in(path);
  MG_REQUIRE(in, "--hostfile ", path, ": cannot be read");
  std::vector<std::string> hosts;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host;
    if (words >> host) hosts.push_back(host);
  }
  return hosts;
}

// A Megatron-LM script name in place of the subcommand: the subcommand that does its work.
void map_script(std::vector<std::string>& args) {
  const std::string& first = args.front();
  if (first.size() < 3 || first.compare(first.size() - 3, 3, ".py") != 0) return;
  static const std::map<std::string, std::string> scripts = {
      {"pretrain_gpt.py", "pretrain-gpt"},
      {"main.py", "evaluate"},  // tasks/main.py --task LAMBADA | WIKITEXT103
      {"run_text_generation_server.py", "serve"},
      {"preprocess_data.py", "preprocess-data"},
      {"merge_datasets.py", "merge-datasets"},
  };
  const std::string base = std::filesystem::path(first).filename().string();
  const auto it = scripts.find(base);
  MG_REQUIRE(it != scripts.end(), "launch runs megatron commands; the Python script '", first,
             "' has no counterpart here (pretrain_gpt.py, tasks/main.py, "
             "tools/run_text_generation_server.py, tools/preprocess_data.py and "
             "tools/merge_datasets.py do): name the command instead, e.g. `megatron launch "
             "--nproc-per-node 2 -- pretrain-gpt ...`");
  log_info("launch: ", first, " runs `megatron ", it->second, "`");
  args.front() = it->second;
}

// The mpirun command line, or an empty vector when this node has nothing to start.
std::vector<std::string> build_command(LaunchOptions& o) {
  const unsigned cores = std::thread::hardware_concurrency();
  const int nproc = parse_nproc(o.nproc_per_node, cores);
  int nnodes = parse_nnodes(o.nnodes);
  if (o.standalone) {
    MG_REQUIRE(nnodes == 1, "--standalone is a single-node job, but --nnodes is ", nnodes);
  }
  if (!o.args.empty() && o.args.front() == "--") o.args.erase(o.args.begin());
  MG_REQUIRE(!o.args.empty(), "launch needs the command to run, e.g. "
             "`megatron launch --nproc-per-node 2 -- pretrain-gpt ...`");
  if (o.args.front().size() > 1 && o.args.front()[0] == '-') {
    std::vector<std::string> names;
    for (const CLI::Option* opt : o.app->get_options())
      for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    const std::string best = closest_name(o.args.front(), names);
    MG_THROW("unknown flag ", o.args.front(), " for launch",
             best.empty() ? std::string() : "; did you mean " + best + "?",
             " (`megatron launch --help` lists the flags; the command to run comes after them)");
  }
  MG_REQUIRE(o.args.front() != "launch", "launch cannot launch itself");
  map_script(o.args);
  MG_REQUIRE(o.max_restarts == 0, "--max-restarts ", o.max_restarts, ": mpirun does not restart "
             "failed ranks; use --max-restarts 0, and --save/--load to resume a failed job");
  MG_REQUIRE(o.node_rank >= 0 && o.node_rank < nnodes, "--node-rank ", o.node_rank,
             " must be in [0, --nnodes ", nnodes, ")");
  MG_REQUIRE(!launched_under_mpi(), "launch was started inside an MPI job; run it directly, "
             "not under mpirun");
  std::string master = o.master_addr;
  if (master.empty() && !o.rdzv_endpoint.empty())
    master = o.rdzv_endpoint.substr(0, o.rdzv_endpoint.rfind(':'));
  if (nnodes > 1 && o.node_rank > 0) {
    log_print(str("launch: --node-rank ", o.node_rank, " of --nnodes ", nnodes, ": under mpirun "
                  "the launch on node 0 starts the ranks of every node (hosts from its "
                  "--hostfile), so there is nothing to start here"));
    return {};
  }
  if ((given(o, "--master-addr") || given(o, "--master-port")) && nnodes == 1)
    log_info("launch: --master-addr/--master-port are not needed: mpirun connects the ranks itself");

  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  MG_REQUIRE(!ec, "cannot find the path of the megatron binary (/proc/self/exe): ", ec.message());
  std::vector<std::string> cmd = {o.mpirun};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  const bool several_hosts = !o.hostfile.empty();
  if (std::getenv("OMP_NUM_THREADS") != nullptr) {
    cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS"});
  } else {
    const unsigned per_rank = several_hosts ? 1u : std::max(1u, cores / unsigned(nproc));
    cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(per_rank)});
  }
  if (!o.log_dir.empty()) cmd.insert(cmd.end(), {"--output-filename", o.log_dir});
  if (nnodes > 1) {
    MG_REQUIRE(!o.hostfile.empty(), "--nnodes ", nnodes, ": torchrun's nodes find each other at "
               "--master-addr, but mpirun starts them all from this node and needs their names: "
               "pass --hostfile FILE (one \"host slots=", nproc, "\" line per node, the "
               "--master-addr host first) and run launch on node 0 only");
    std::vector<std::string> hosts = read_hostfile(o.hostfile);
    MG_REQUIRE(int(hosts.size()) >= nnodes, "--hostfile ", o.hostfile, " names ", hosts.size(),
               " host(s), fewer than --nnodes ", nnodes);
    if (!master.empty() && !is_local_host(master)) {
      const auto it = std::find(hosts.begin(), hosts.end(), master);
      MG_REQUIRE(it != hosts.end(), "--master-addr ", master, " is not in --hostfile ", o.hostfile,
                 ": rank 0 runs on the master node, so list it there");
      std::rotate(hosts.begin(), it, it + 1);  // the master first: rank 0 runs there
    }
    hosts.resize(size_t(nnodes));
    std::string list;
    for (const auto& h : hosts) list += (list.empty() ? "" : ",") + h + ":" + std::to_string(nproc);
    cmd.insert(cmd.end(), {"-np", std::to_string(nnodes * nproc), "--host", list, "--npernode",
                           std::to_string(nproc)});
  } else if (several_hosts) {
    MG_REQUIRE(std::filesystem::is_regular_file(o.hostfile), "--hostfile ", o.hostfile,
               ": no such file");
    cmd.insert(cmd.end(), {"--hostfile", o.hostfile, "--npernode", std::to_string(nproc)});
  } else {
    if (cores == 0 || unsigned(nproc) > cores) cmd.push_back("--oversubscribe");
    cmd.insert(cmd.end(), {"-np", std::to_string(nproc)});
  }
  cmd.push_back(self.string());
  cmd.insert(cmd.end(), o.args.begin(), o.args.end());
  return cmd;
}

CommandRegistrar reg("launch", "Run a command on several processes (ranks) under mpirun; takes torchrun's flags",
                     900, [](CLI::App& sub) {
  auto o = std::make_shared<LaunchOptions>();
  o->app = &sub;
  sub.positionals_at_end();  // everything from the command on is the command's
  sub.add_option("--nproc-per-node,--nproc_per_node", o->nproc_per_node,
                 "Processes (ranks) per node: a number, or auto / cpu (this machine's cores)")
      ->capture_default_str();
  sub.add_option("--nnodes", o->nnodes, "Nodes (more than 1 needs --hostfile)")->capture_default_str();
  sub.add_option("--node-rank,--node_rank", o->node_rank,
                 "This node's rank; mpirun starts every node from node 0, so others exit at once")
      ->capture_default_str();
  sub.add_option("--master-addr,--master_addr", o->master_addr,
                 "Node 0's address: rank 0 runs there (first host of --hostfile)");
  sub.add_option("--master-port,--master_port", o->master_port,
                 "Accepted: mpirun connects the ranks itself")->capture_default_str();
  sub.add_option("--rdzv-backend,--rdzv_backend", o->rdzv_backend, "Accepted (rendezvous is mpirun's)")
      ->capture_default_str();
  sub.add_option("--rdzv-endpoint,--rdzv_endpoint", o->rdzv_endpoint,
                 "HOST[:PORT]: the master address when --master-addr is not given");
  sub.add_option("--rdzv-id,--rdzv_id", o->rdzv_id, "Accepted (one job per mpirun)")->capture_default_str();
  sub.add_option("--rdzv-conf,--rdzv_conf", o->rdzv_conf, "Accepted (rendezvous is mpirun's)");
  sub.add_flag("--standalone", o->standalone, "Single-node job (the default here)");
  sub.add_option("--max-restarts,--max_restarts", o->max_restarts,
                 "Only 0: mpirun does not restart failed ranks")->capture_default_str();
  sub.add_option("--log-dir,--log_dir", o->log_dir, "One output file per rank in this folder");
  sub.add_option("--hostfile", o->hostfile,
                 "Open MPI hostfile for multi-node runs (--nproc-per-node ranks on each host)");
  sub.add_option("--mpirun", o->mpirun, "The mpirun executable")->capture_default_str();
  sub.add_flag("--dry-run", o->dry_run, "Print the mpirun command instead of running it");
  sub.add_option("args", o->args,
                 "The megatron subcommand (or Megatron script name) and its flags; a '--' before "
                 "it is optional");
  sub.callback([o] {
    const auto cmd = build_command(*o);
    if (cmd.empty()) return;
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
    if (o->dry_run) {
      log_print(line);
      return;
    }
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
