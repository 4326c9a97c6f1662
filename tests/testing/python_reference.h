// Test fixtures whose tests compare difftrain with a Python reference from PyPI, in a virtual
// environment a script makes once per machine: diffusers 0.27.2 (tests/reference/diffusers_env.sh),
// the same with peft 0.10.0 (tests/reference/peft_env.sh) or transformers 4.40.2
// (scripts/text_encoder_env.sh), or tensorboard 2.16.2 (tests/reference/tensorboard_env.sh). The
// fixture finds that Python once per suite, skips every test with the reason where PyPI cannot be
// reached, runs tests/reference's scripts, and keeps a failed test's files (their folder is
// printed).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "model/io/safetensors.h"
#include "tests/testing/python_fork_server.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {

// The last line of a command's output, without its newline (an environment script's python).
inline std::string LastLine(const std::string& output) {
  std::string line = output.substr(output.find_last_of('\n', output.size() - 2) + 1);
  while (!line.empty() && line.back() == '\n')
    line.pop_back();
  return line;
}

// Env names its script (relative to the source tree) and the reference it provides:
//   struct Env { static constexpr const char* kScript = "…"; static constexpr const char* kName =
//   "…"; };
template <typename Env>
class PythonReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (python_ != nullptr || skip_reason_ != nullptr) return;
    const CommandResult env =
        RunCommand(ShellQuote(std::string(DIFFTRAIN_SOURCE_DIR "/") + Env::kScript) + " 2>&1");
    if (env.exit_code == 0) {
      python_ = new std::string(LastLine(env.output));
    } else {
      skip_reason_ = new std::string(env.output);
    }
  }

  void SetUp() override {
    if (python_ == nullptr) {
      GTEST_SKIP() << "no " << Env::kName << " reference (PyPI unreachable?): " << *skip_reason_;
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      std::cout << "files kept in " << temp_.path() << "\n";
      temp_.Keep();
    }
  }

  // The reference's Python running one of tests/reference's scripts (through this program's
  // fork server where it can, tests/testing/python_fork_server.h).
  static CommandResult RunScript(const std::string& script, const std::string& args) {
    const std::string path = DIFFTRAIN_SOURCE_DIR "/tests/reference/" + script;
    if (std::optional<CommandResult> r = RunPythonScript(*python_, path, args)) return *r;
    return RunCommand(ShellQuote(*python_) + " " + ShellQuote(path) + " " + args + " 2>&1");
  }

  static inline std::string* python_ = nullptr;
  static inline std::string* skip_reason_ = nullptr;
  TempDir temp_{"python_reference"};
  std::filesystem::path dir_ = temp_.path();
};

// ‖got − want‖ / ‖want‖, in double.
inline double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// Tensor `name` of a reference's output file as floats (a test failure when it is missing), and
// its shape into `shape`.
inline std::vector<float> ReferenceTensor(const io::SafetensorsFile& file, const std::string& name,
                                          std::vector<int64_t>* shape = nullptr) {
  const io::TensorView* t = file.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  size_t n = 1;
  for (int64_t d : t->shape)
    n *= d;
  std::vector<float> v(n);
  EXPECT_TRUE(file.CopyAsF32(name, t->shape, v.data()).ok()) << name;
  if (shape != nullptr) *shape = t->shape;
  return v;
}

struct DiffusersEnv {
  static constexpr const char* kScript = "tests/reference/diffusers_env.sh";
  static constexpr const char* kName = "diffusers 0.27.2";
};
using DiffusersReference = PythonReference<DiffusersEnv>;

// diffusers 0.27.2 with peft 0.10.0 (DoRA's reference), in a venv of its own.
struct PeftEnv {
  static constexpr const char* kScript = "tests/reference/peft_env.sh";
  static constexpr const char* kName = "peft 0.10.0";
};

struct TransformersEnv {
  static constexpr const char* kScript = "scripts/text_encoder_env.sh";
  static constexpr const char* kName = "transformers 4.40.2";
};
using TransformersReference = PythonReference<TransformersEnv>;

// TensorBoard 2.16.2's event reader (tests/reference/tensorboard_events.py).
struct TensorBoardEnv {
  static constexpr const char* kScript = "tests/reference/tensorboard_env.sh";
  static constexpr const char* kName = "tensorboard 2.16.2";
};
using TensorBoardReference = PythonReference<TensorBoardEnv>;

}  // namespace difftrain::testing
