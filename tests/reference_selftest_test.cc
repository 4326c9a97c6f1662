// Runs the PyTorch reference's self-test (tests/reference/selftest.py): the checker of the
// C++ model's debug dump must pass a correct dump, fail a wrong gradient and reject a
// malformed file, and the reference model must have DiT's parameter count and FLOPs.
#include <gtest/gtest.h>

#include "tests/testing/run_command.h"

namespace difftrain::testing {
namespace {

TEST(ReferenceSelftest, Passes) {
  const CommandResult result = RunCommand(
      "/usr/bin/python3 " + ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/selftest.py"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

}  // namespace
}  // namespace difftrain::testing
