#include "common/exit_codes.h"

#include <cstdio>

namespace difftrain {

int ReportBadInput(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "difftrain %s: %s\n", command.c_str(), message.c_str());
  return kExitBadInput;
}

}  // namespace difftrain
