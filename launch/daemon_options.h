// What the daemon commands (controller, worker, run, validate) share: flags that fall
// back to environment variables, and the signals that stop a job with a checkpoint.
#pragma once

#include <atomic>
#include <optional>
#include <string>

namespace difftrain::launch {

// The flag's value, else the environment variable's, else `fallback`.
std::string FlagOrEnvString(const std::optional<std::string>& flag, const char* env,
                            const std::string& fallback = "");

// Installs handlers that store the signal number for SIGTERM, SIGUSR1 and SIGINT, and
// returns the flag they set.
const std::atomic<int>& InstallStopSignals();

// This host's name (the default node name).
std::string HostName();

// The path of the running `difftrain` binary (ranks run it).
std::string SelfBinary();

}  // namespace difftrain::launch
