// `promtool check metrics` (Debian's prometheus package) on an exposition: the lint that
// every /metrics of difftrain must pass.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/run_command.h"

namespace difftrain::testing {

inline CommandResult PromtoolCheckMetrics(const std::string& exposition) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("promtool-" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file) << exposition;
  CommandResult result = RunCommand("promtool check metrics < " + ShellQuote(file.string()));
  std::filesystem::remove(file);
  return result;
}

}  // namespace difftrain::testing
