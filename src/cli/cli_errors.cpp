// Parse-error messages naming the unknown command or flag; see cli_errors.h.
#include "cli/cli_errors.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"

namespace megatron::cli {

namespace {

std::string normalized(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = c == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "--name" for every long name and "-n" for every short name of the options of `app`.
std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(s->get_name());
  return names;
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string best = closest_name(name, candidates);
  return best.empty() ? std::string() : "; did you mean " + best + "?";
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

// Whether a flag of `app` takes a value (so the next argument is not a command or a flag name).
bool takes_value(const CLI::App& app, const std::string& flag) {
  const CLI::Option* o = app.get_option_no_throw(flag);
  return o != nullptr && o->get_type_size_max() > 0;
}

}  // namespace

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string n = normalized(name);
  std::string best;
  size_t best_distance = std::max<size_t>(2, n.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(n, normalized(c));
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string explain_parse_error(const CLI::App& app, int argc, const char* const* argv,
                                const CLI::ParseError& e) {
  // Walk the command line as CLI11 does: options of the current (sub)command, then a word that
  // names a subcommand descends into it; "--" ends the options.
  const CLI::App* current = &app;
  std::string path = "megatron";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() > 1 && arg[0] == '-' && !is_number(arg)) {
      const std::string name = arg.substr(0, arg.find('='));
      if (current->get_option_no_throw(name) == nullptr) {
        std::string where = current == &app ? "" : " for " + path.substr(9);
        return str("unknown flag ", name, where, did_you_mean(name, flag_names(*current)), " (`", path,
                   " --help` lists the flags)");
      }
      if (arg.find('=') == std::string::npos && takes_value(*current, name)) {
        // Skip the values; a multi-value option ends at the next flag.
        const CLI::Option* o = current->get_option_no_throw(name);
        const int most = o->get_items_expected_max();
        for (int k = 0; k < most && i + 1 < argc && !(argv[i + 1][0] == '-' &&
                                                        !is_number(argv[i + 1]));
             ++k)
          ++i;
      }
      continue;
    }
    const std::vector<std::string> commands = command_names(*current);
    if (commands.empty()) {
      if (current->get_positionals_at_end()) break;  // the rest is another command's (launch)
      continue;                                       // a positional value
    }
    const CLI::App* next = nullptr;
    for (const CLI::App* s : current->get_subcommands([](const CLI::App*) { return true; }))
      if (s->check_name(arg)) next = s;
    if (next == nullptr) {
      return str("unknown command '", path == "megatron" ? arg : path.substr(9) + " " + arg, "'",
                 did_you_mean(arg, commands), " (`", path, " --help` lists the commands)");
    }
    current = next;
    path += " " + arg;
  }
  const std::string what = e.what();
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
      what.find("subcommand") != std::string::npos) {
    return str("no command given", path == "megatron" ? "" : " after '" + path + "'", " (`", path,
               " --help` lists the commands)");
  }
  return path == "megatron" ? what : path.substr(9) + ": " + what;
}

}  // namespace megatron::cli
