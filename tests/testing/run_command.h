// Running a command from a test and capturing what it prints: tests drive Python scripts
// and the built `difftrain` binary this way, and print the output on failure.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace difftrain::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not start or did not exit normally
  std::string output;  // stdout and stderr, interleaved as printed
};

// Runs `command` through /bin/sh with stderr merged into stdout.
inline CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    result.output = "popen failed for: " + command;
    return result;
  }
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) {
    result.output.append(buffer, n);
  }
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

// Quotes `word` as one /bin/sh word.
inline std::string ShellQuote(const std::string& word) {
  std::string quoted = "'";
  for (char c : word) {
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return quoted + "'";
}

#ifdef DIFFTRAIN_BINARY
// Runs the built `difftrain` with `args` (already quoted where needed).
inline CommandResult RunDifftrain(const std::string& args) {
  return RunCommand(std::string(DIFFTRAIN_BINARY) + " " + args);
}
#endif

}  // namespace difftrain::testing
