// Subcommand registry for the `megatron` binary. Each src/cli/<name>.cpp registers itself with a
// static CommandRegistrar; main.cpp builds the CLI11 app from the registry. A command's setup adds
// its options to the subcommand and sets a callback that parses nothing itself: CLI11 validates
// flags, the callback validates meaning (throwing megatron::Error) and calls the library.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace megatron::cli {

using CommandSetup = std::function<void(CLI::App& sub)>;

struct CommandRegistrar {
  // `order` sorts the commands in --help (lower first).
  CommandRegistrar(std::string name, std::string description, int order, CommandSetup setup);
};

}  // namespace megatron::cli
