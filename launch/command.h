// The `difftrain` subcommands. Each lives in its own launch/<name>_command.cc and registers
// itself with DIFFTRAIN_COMMAND, so adding a command never touches a shared file.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace difftrain::launch {

// Exit codes of every subcommand (docs/cli.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitBadInput = 2;
// EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 after writing a checkpoint; a rerun resumes.
inline constexpr int kExitCheckpointed = 75;

// Declares the subcommand's options on `app` and returns the function that runs it after
// the command line has been parsed; that function returns the process exit code.
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandSpec {
  std::string name;
  std::string description;
  CommandSetup setup;
};

bool RegisterCommand(CommandSpec spec);

// Prints "difftrain <command>: <message>" on stderr and returns kExitBadInput.
int ReportBadInput(const std::string& command, const std::string& message);

}  // namespace difftrain::launch

#define DIFFTRAIN_COMMAND(var, ...) \
  static const bool var = ::difftrain::launch::RegisterCommand(__VA_ARGS__)
