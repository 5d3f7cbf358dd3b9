// The `megatron` binary: git-style subcommands over the library. Thin by design: every command
// lives in its own file and registers itself (command.h).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cli/cli_errors.h"
#include "cli/command.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"

namespace megatron::cli {

namespace {
struct Entry {
  std::string name, description;
  int order;
  CommandSetup setup;
};
std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(std::string name, std::string description, int order,
                                   CommandSetup setup) {
  registry().push_back({std::move(name), std::move(description), order, std::move(setup)});
}

}  // namespace megatron::cli

int main(int argc, char** argv) {
  using namespace megatron;
  tune_host_allocator();
  CLI::App app{"megatron.cpp: train, evaluate and serve transformer language models", "megatron"};
  app.set_version_flag("--version", std::string("megatron.cpp ") + MEGATRON_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  std::string level = "info";
  app.add_option("--log-level", level, "debug, info, warn or error")->capture_default_str();
  auto& entries = cli::registry();
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  for (auto& e : entries) {
    CLI::App* sub = app.add_subcommand(e.name, e.description);
    e.setup(*sub);
  }
  app.parse_complete_callback([&] { set_log_level(log_level_from_name(level)); });
  // An error on one rank of an MPI job ends the whole job (abort_job_if_distributed) instead of
  // leaving the other ranks blocked in their next collective; the message names the rank.
  auto fail = [](int code, const std::string& message) {
    std::fprintf(stderr, "%s%s\n", rank_prefix().c_str(), message.c_str());
    std::fflush(stderr);
    abort_job_if_distributed(code);
    return code;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Every other parse error is a user mistake: "error: ...", status 1 (as the README says).
    return fail(1, std::string("error: ") + cli::explain_parse_error(app, argc, argv, e));
  } catch (const Error& e) {
    return fail(1, std::string("error: ") + e.what());
  } catch (const InternalError& e) {
    return fail(70, std::string(e.what()) + "\n(this is a bug in megatron.cpp; please report it)");
  } catch (const std::bad_alloc&) {
    return fail(1, "error: out of memory");
  } catch (const std::exception& e) {
    return fail(1, std::string("error: ") + e.what());
  }
  return 0;
}
