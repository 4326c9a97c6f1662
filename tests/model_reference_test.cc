// Checks the C++ DiT and Latte against the independent PyTorch references
// (tests/reference/dit_torch.py, latte_torch.py): `difftrain debug-dump` writes one training
// step of a tiny model, and tests/reference/check_debug_dump.py recomputes it in float64 and
// compares x_t, the output, the loss and every gradient (relative L2 error <= 1e-5; absolute
// where the reference is exactly zero).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <ostream>
#include <string>

#include <fmt/format.h>

#include "common/temp_dir.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {
namespace {

struct DumpCase {
  const char* name;
  int patch;
  int input_size;
  int depth;
  bool learn_sigma;
  // false keeps DiT's initialisation, whose zero adaLN and final Linears make most
  // gradients exactly zero.
  bool random_weights;
  int seed;
  const char* diffusion = "";  // debug-dump's diffusion flags
};

// Names the case in gtest's messages instead of dumping its bytes.
void PrintTo(const DumpCase& c, std::ostream* os) {
  *os << c.name;
}

// Keeps a failing case's files, and dumps and checks one model.
class ReferenceFixture {
 protected:
  void DumpAndCheck(const std::string& flags) {
    const std::string dump = (dir_ / "dump.safetensors").string();
    const CommandResult dumped = RunCommand(fmt::format(
        "{} debug-dump {} --out {}", ShellQuote(DIFFTRAIN_BINARY), flags, ShellQuote(dump)));
    ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
    const CommandResult checked =
        RunCommand("/usr/bin/python3 " +
                   ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/check_debug_dump.py") + " " +
                   ShellQuote(dump));
    EXPECT_EQ(checked.exit_code, 0) << checked.output;
  }

  void KeepIfFailed(bool failed) {
    if (failed) {
      std::cout << "files kept in " << temp_.path() << "\n";
      temp_.Keep();
    }
  }

  TempDir temp_{"model_reference"};
  std::filesystem::path dir_ = temp_.path();
};

class DitReferenceTest : public ::testing::TestWithParam<DumpCase>, protected ReferenceFixture {
 protected:
  // A failing case keeps its files for a closer look.
  void TearDown() override { KeepIfFailed(HasFailure()); }
};

TEST_P(DitReferenceTest, DebugDumpMatchesReference) {
  const DumpCase& c = GetParam();
  DumpAndCheck(
      fmt::format("--depth {} --hidden 64 --heads 4 --patch {} --input-size {} --in-channels 4 "
                  "--num-classes 10 --learn-sigma {} --seed {} --batch 3 {} {}",
                  c.depth, c.patch, c.input_size, c.learn_sigma, c.seed,
                  c.random_weights ? "--random-weights" : "", c.diffusion));
}

// Together the cases cover learn_sigma on and off, patch 2 and 4, input 8 and 16, 2 and 3
// blocks, DiT's own initialisation, and v-prediction on the scaled linear schedule rescaled to
// zero terminal SNR and on the cosine one.
INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, DitReferenceTest,
    ::testing::Values(DumpCase{"Patch2Input8LearnSigma", 2, 8, 2, true, true, 1},
                      DumpCase{"Patch2Input8NoSigma", 2, 8, 2, false, true, 2},
                      DumpCase{"Patch4Input16ThreeBlocks", 4, 16, 3, true, true, 3},
                      DumpCase{"Patch2Input16NoSigma", 2, 16, 2, false, true, 4},
                      DumpCase{"DitInitPatch4Input8ThreeBlocks", 4, 8, 3, true, false, 5},
                      // v-prediction on Stable Diffusion's schedule rescaled to zero terminal
                      // SNR, the last timestep (x_t the noise, v = −x0) among the batch's.
                      DumpCase{"VPredictionZeroSnrScaledLinear", 2, 8, 2, false, true, 6,
                               "--prediction v --zero-terminal-snr --schedule scaled_linear "
                               "--beta-start 0.00085 --beta-end 0.012 --timesteps 999,412,3"},
                      // v-prediction with learn_sigma on the cosine schedule.
                      DumpCase{"VPredictionCosineLearnSigma", 2, 8, 2, true, true, 7,
                               "--prediction v --schedule cosine"},
                      // diffusers' offset noise and input perturbation: x_t of the perturbed
                      // noise, v of the offset one.
                      DumpCase{"NoiseOffsetInputPerturbationVPrediction", 2, 8, 2, false, true, 8,
                               "--prediction v --noise-offset 0.1 --input-perturbation 0.1 "
                               "--timesteps 999,412,3"}),
    [](const ::testing::TestParamInfo<DumpCase>& info) { return std::string(info.param.name); });

// checkpoint.init_from with PyTorch's weights: the reference DiT's state_dict (pos_embed
// included), saved as safetensors, is what `debug-dump --init-from` (the path a job's
// checkpoint.init_from takes) starts from, tensor for tensor, and the step from it is the
// reference's step.
class DitInitFromTest : public ::testing::Test, protected ReferenceFixture {
 protected:
  void TearDown() override { KeepIfFailed(HasFailure()); }
};

TEST_F(DitInitFromTest, AReferenceStateDictLoadsExactlyAndItsStepMatches) {
  const std::string model =
      "--depth 2 --hidden 64 --heads 4 --patch 2 --input-size 8 --in-channels 4 "
      "--num-classes 10 --learn-sigma true --seed 1 --batch 3";
  const std::string script = ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/init_weights.py");
  const std::string config = (dir_ / "config.safetensors").string();
  const std::string weights = (dir_ / "DiT-custom.safetensors").string();
  ASSERT_EQ(RunCommand(fmt::format("{} debug-dump {} --out {}", ShellQuote(DIFFTRAIN_BINARY), model,
                                   ShellQuote(config)))
                .exit_code,
            0);
  const CommandResult saved = RunCommand("/usr/bin/python3 " + script + " save-dit " +
                                         ShellQuote(config) + " " + ShellQuote(weights));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  DumpAndCheck(model + " --init-from " + ShellQuote(weights));
  const CommandResult compared =
      RunCommand("/usr/bin/python3 " + script + " compare-dit " + ShellQuote(weights) + " " +
                 ShellQuote((dir_ / "dump.safetensors").string()));
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
}

// Latte: a named config and custom shapes, covering patch 2, 4 and 8, 1, 4 and 8 frames,
// with and without classes (and the null class), learn_sigma on and off, two block pairs,
// v-prediction on a zero terminal SNR schedule.
struct LatteCase {
  const char* name;
  const char* flags;
};

void PrintTo(const LatteCase& c, std::ostream* os) {
  *os << c.name;
}

class LatteReferenceTest : public ::testing::TestWithParam<LatteCase>, protected ReferenceFixture {
 protected:
  void TearDown() override { KeepIfFailed(HasFailure()); }
};

TEST_P(LatteReferenceTest, DebugDumpMatchesReference) {
  DumpAndCheck(fmt::format("{} --batch 2 --random-weights", GetParam().flags));
}

INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, LatteReferenceTest,
    ::testing::Values(
        LatteCase{"LatteS8Frames4Classes",
                  "--model Latte-S/8 --frames 4 --num-classes 10 --seed 1"},
        LatteCase{"Patch2Frames8Unconditional",
                  "--model latte --patch 2 --hidden 64 --heads 4 --depth 2 --input-size 8 "
                  "--frames 8 --num-classes 0 --learn-sigma false --seed 2"},
        LatteCase{"Patch4Frames4NoNullClassTwoPairs",
                  "--model latte --patch 4 --hidden 32 --heads 2 --depth 4 --input-size 16 "
                  "--frames 4 --num-classes 5 --class-dropout 0 --seed 3"},
        LatteCase{"Patch2Frames1LearnSigma",
                  "--model latte --patch 2 --hidden 48 --heads 3 --depth 2 --input-size 8 "
                  "--frames 1 --num-classes 3 --seed 4"},
        // A video model of v-prediction on a zero terminal SNR schedule.
        LatteCase{"VPredictionZeroSnr",
                  "--model latte --patch 2 --hidden 64 --heads 4 --depth 2 --input-size 8 "
                  "--frames 4 --num-classes 3 --learn-sigma false --prediction v "
                  "--zero-terminal-snr --schedule scaled_linear --beta-start 0.00085 "
                  "--beta-end 0.012 --seed 5 --timesteps 999,20"}),
    [](const ::testing::TestParamInfo<LatteCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace difftrain::testing
