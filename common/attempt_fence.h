// The attempt fence: when a job restarts, ranks of the old attempt may still be running (a
// frozen daemon cannot kill them, a restarted controller starts counting attempts again), and
// none of them may commit a checkpoint once a newer attempt has started. The controller
// publishes, in the store it serves, which attempt of which controller process is current;
// rank 0 reads it just before each commit and refuses when it is not its own.
#pragma once

#include <string>
#include <string_view>

namespace difftrain {

// Under the controller's reserved prefix: ranks can read it, never write it.
inline constexpr std::string_view kCurrentAttemptKey = "controller/attempt";

// The key's value: the controller process's random id and the attempt it launched.
inline std::string CurrentAttempt(const std::string& incarnation, int attempt) {
  return incarnation + ":" + std::to_string(attempt);
}

}  // namespace difftrain
