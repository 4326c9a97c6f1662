// The `difftrain` subcommands. Each lives in its own launch/<name>_command.cc and registers
// itself with DIFFTRAIN_COMMAND, so adding a command never touches a shared file.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/exit_codes.h"

namespace difftrain::launch {

// Declares the subcommand's options on `app` and returns the function that runs it after
// the command line has been parsed; that function returns the process exit code.
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandSpec {
  std::string name;
  std::string description;
  CommandSetup setup;
};

bool RegisterCommand(CommandSpec spec);

}  // namespace difftrain::launch

#define DIFFTRAIN_COMMAND(var, ...) \
  static const bool var = ::difftrain::launch::RegisterCommand(__VA_ARGS__)
