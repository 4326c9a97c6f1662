// A test fixture whose tests compare difftrain with diffusers 0.27.2 (from PyPI, in the
// virtual environment tests/reference/diffusers_env.sh makes once per machine): it finds that
// Python once per suite, skips every test with the reason where PyPI cannot be reached, runs
// tests/reference's scripts, and keeps a failed test's files (their folder is printed).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "common/temp_dir.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {

class DiffusersReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (python_ != nullptr || skip_reason_ != nullptr) return;
    const CommandResult env =
        RunCommand(ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/diffusers_env.sh") + " 2>&1");
    if (env.exit_code == 0) {
      python_ = new std::string(
          env.output.substr(env.output.find_last_of('\n', env.output.size() - 2) + 1));
      while (!python_->empty() && python_->back() == '\n')
        python_->pop_back();
    } else {
      skip_reason_ = new std::string(env.output);
    }
  }

  void SetUp() override {
    if (python_ == nullptr) {
      GTEST_SKIP() << "no diffusers 0.27.2 reference (PyPI unreachable?): " << *skip_reason_;
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      std::cout << "files kept in " << temp_.path() << "\n";
      temp_.Keep();
    }
  }

  // The reference's Python running one of tests/reference's scripts.
  static CommandResult RunScript(const std::string& script, const std::string& args) {
    return RunCommand(ShellQuote(*python_) + " " +
                      ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/" + script) + " " + args +
                      " 2>&1");
  }

  static inline std::string* python_ = nullptr;
  static inline std::string* skip_reason_ = nullptr;
  TempDir temp_{"diffusers_reference"};
  std::filesystem::path dir_ = temp_.path();
};

}  // namespace difftrain::testing
