// The reference tests' fork server (tests/reference/fork_server.py through
// tests/testing/python_fork_server.h) against the shell it stands in for: each script run
// through it exits and prints as `python SCRIPT ARGS 2>&1` does, sees the directory and
// environment of its caller at the time of the call, and nothing of an earlier run.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "tests/testing/python_fork_server.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

TEST(IsPlainWordsTest, AcceptsQuotedWordsAndRefusesWhatTheShellWouldExpand) {
  EXPECT_TRUE(IsPlainWords("make 'a b' 6 --tol 1e-4"));
  EXPECT_TRUE(IsPlainWords(ShellQuote("it's $HOME; *") + " " + ShellQuote(R"({"x": [1]})")));
  EXPECT_TRUE(IsPlainWords(""));
  for (const char* shell : {"a > b", "a | b", "$HOME", "a; b", "`x`", "a*", "\"a\"", "a && b",
                            "~/x", "'unclosed", "a\nb"}) {
    EXPECT_FALSE(IsPlainWords(shell)) << shell;
  }
}

class PythonForkServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
  }

  // `body` as a script in the test's folder; its path.
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = (std::filesystem::path(dir_.path()) / name).string();
    std::ofstream(path) << body;
    return path;
  }

  // The script run both ways: they must agree (`same_output`: in what they print too); the
  // server's result.
  CommandResult Both(const std::string& script, const std::string& args, bool same_output = true) {
    const CommandResult shell =
        RunCommand(std::string(kPython) + " " + ShellQuote(script) + " " + args + " 2>&1");
    const std::optional<CommandResult> served = server_.Run(script, args);
    EXPECT_TRUE(served.has_value()) << "the server ended";
    if (!served) return {};
    EXPECT_EQ(served->exit_code, shell.exit_code) << args;
    if (same_output) {
      EXPECT_EQ(served->output, shell.output) << args;
    }
    return *served;
  }

  TempDir dir_{"fork_server_test"};
  PythonForkServer server_{kPython};
};

TEST_F(PythonForkServerTest, ExitsAndPrintsAsTheScriptRunOnItsOwn) {
  const std::string script = Script("echo.py", R"(import sys, os
print("name", __name__, "argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(__file__))
sys.stdout.flush()
print("to stderr", file=sys.stderr)
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if len(sys.argv) > 1 and sys.argv[1] == "message":
    sys.exit("a message")
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise ValueError("raised")
if len(sys.argv) > 1 and sys.argv[1] == "signal":
    import signal
    os.kill(os.getpid(), signal.SIGTERM)
)");
  EXPECT_EQ(Both(script, "").exit_code, 0);
  const CommandResult words = Both(script, ShellQuote("two words") + " " + ShellQuote("it's"));
  EXPECT_NE(words.output.find("['two words', \"it's\"]"), std::string::npos) << words.output;
  EXPECT_NE(words.output.find("name __main__"), std::string::npos) << words.output;
  EXPECT_NE(words.output.find("path0 True"), std::string::npos) << words.output;
  EXPECT_EQ(Both(script, "exit 3").exit_code, 3);
  EXPECT_EQ(Both(script, "message").exit_code, 1);
  const CommandResult raised = Both(script, "raise");
  EXPECT_EQ(raised.exit_code, 1);
  EXPECT_NE(raised.output.find("ValueError: raised"), std::string::npos) << raised.output;
  // The shell reports a signal's end as 128 + its number, and so does the server (which does
  // not also print the shell's "Terminated").
  const CommandResult signalled = Both(script, "signal", /*same_output=*/false);
  EXPECT_EQ(signalled.exit_code, 128 + 15);
  EXPECT_EQ(signalled.output, "name __main__ argv ['signal'] path0 True\nto stderr\n");
}

TEST_F(PythonForkServerTest, EachRunHasItsCallersDirectoryAndEnvironmentAndNoEarlierRunsState) {
  const std::string script = Script("state.py", R"(import json, os, sys
print(os.getcwd(), os.environ.get("FORK_SERVER_TEST"), getattr(json, "marked", None))
json.marked = sys.argv[1]
)");
  const std::filesystem::path here = std::filesystem::current_path();
  ::setenv("FORK_SERVER_TEST", "first", 1);
  EXPECT_EQ(Both(script, "one").output, here.string() + " first None\n");
  ::setenv("FORK_SERVER_TEST", "second", 1);
  std::filesystem::current_path(dir_.path());
  const CommandResult second = Both(script, "two");
  std::filesystem::current_path(here);
  ::unsetenv("FORK_SERVER_TEST");
  EXPECT_EQ(second.output, dir_.path() + " second None\n");
}

// A package that prints on import (all-MiniLM-L6-v2's does) prints in the server, not in the
// answers: runs go on. One that starts a thread on import is refused before anything runs, so
// the caller runs the script itself.
TEST_F(PythonForkServerTest, APackagesBannerDoesNotDisturbItAndAThreadOnImportIsRefused) {
  const std::filesystem::path packages = std::filesystem::path(dir_.path()) / "site";
  std::filesystem::create_directories(packages);
  std::ofstream(packages / "noisy_banner.py") << "print('banner from an import')\n";
  std::ofstream(packages / "starts_a_thread.py")
      << "import threading, time\n"
      << "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n";
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("PYTHONPATH", packages.c_str(), 1);
  PythonForkServer server(kPython);
  const std::string noisy = Script("noisy.py", "import noisy_banner\nprint('ran')\n");
  for (int run = 0; run < 2; ++run) {
    const std::optional<CommandResult> r = server.Run(noisy, "");
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->exit_code, 0) << r->output;
    EXPECT_EQ(r->output, "ran\n");
  }
  const std::string threaded =
      Script("threaded.py", "import starts_a_thread\nopen('ran', 'w').close()\n");
  EXPECT_FALSE(server.Run(threaded, "").has_value());
  EXPECT_FALSE(server.ok());
  EXPECT_FALSE(std::filesystem::exists("ran"));
  if (old != nullptr) {
    ::setenv("PYTHONPATH", saved.c_str(), 1);
  } else {
    ::unsetenv("PYTHONPATH");
  }
}

TEST_F(PythonForkServerTest, AServerThatCannotStartAnswersNothing) {
  PythonForkServer missing("/nonexistent/python3");
  EXPECT_FALSE(missing.Run(Script("x.py", "print(1)\n"), "").has_value());
  // …and is not asked again.
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace difftrain::testing
