// The exit codes of every difftrain process (docs/cli.md), and the one way bad input is
// reported before exiting with kExitBadInput.
#pragma once

#include <string>

namespace difftrain {

inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitBadInput = 2;
// EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 after writing a checkpoint; a rerun resumes.
inline constexpr int kExitCheckpointed = 75;

// Prints "difftrain <command>: <message>" on stderr and returns kExitBadInput.
int ReportBadInput(const std::string& command, const std::string& message);

}  // namespace difftrain
