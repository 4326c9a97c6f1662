// Logging setup shared by every difftrain process (spdlog underneath).
#pragma once

#include <string>

#include "common/status.h"

namespace difftrain {

// Sets the global log level from "trace|debug|info|warn|error|off" and a pattern that
// prefixes lines with time and level. Called once by each process's main.
Status SetupLogging(const std::string& level);

}  // namespace difftrain
