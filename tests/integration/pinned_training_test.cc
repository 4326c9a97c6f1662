// Pins what a small job trains to, bit for bit, across changes of the code around the model
// (the model-family seam, the job spec, the rank runtime): the checksum of every tensor of
// its final checkpoint was recorded with the code before those changes (commit f09f8eb), and
// a checkpoint that code wrote (tests/data/pinned/checkpoint, step 3) must still load and
// resume to recorded final tensors. A change of the model's arithmetic (a kernel's rounding)
// changes both checksums; such a change re-records them and says so below.
//
// The bits must not depend on the machine either. OpenBLAS picks its kernels by the CPU it
// finds (Haswell, SkylakeX, Cooperlake, ...), and they round differently: the job runs with
// the Haswell kernels, which every x86-64 CPU with AVX2 runs. Our own kernels sum in orders of
// their own, not the compiler's (model/cpu/attention.cc: the softmax).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "tests/testing/checkpoint_tensors.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

// FNV-1a over every tensor's name and bytes, in name order.
uint64_t Checksum(const std::map<std::string, std::string>& tensors) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s)
      h = (h ^ c) * 1099511628211ull;
  };
  for (const auto& [name, bytes] : tensors) {
    mix(name);
    mix(bytes);
  }
  return h;
}

// `difftrain train` of tests/data/pinned/job.yaml. Recorded before the refactor as
// 0x2b45f479773c226f, which every commit up to the vectorised attention softmax reproduced;
// that softmax (model/cpu/attention.cc: the polynomial exp of vec_math.h, and the row sums in
// SIMD order) is the only change of DiT's arithmetic since, and with the softmax of before
// the old checksum is reproduced. Re-recorded then as 0x658dc27eff7ad2f8, which a later
// build machine did not reproduce (0x7ea02b4a0a678ddd with its own OpenBLAS kernels,
// 0x5c9e7c015c45cee2 with Haswell's); re-recorded with the Haswell kernels and the softmax's
// sums in a fixed order, the same from builds for AVX2 (-march=znver3) and AVX-512 (native,
// and with -mprefer-vector-width=512).
constexpr uint64_t kPinnedChecksum = 0xdd98523cb3be8904ull;
// The checkpoint of tests/data/pinned/checkpoint (step 3, written by the code before the
// refactor, so by the softmax of before) resumed to step 6: until the softmax changed, the
// same as kPinnedChecksum; since, its first three steps carry the old arithmetic.
constexpr uint64_t kResumedChecksum = 0x6daa11d80fbea04eull;
constexpr int64_t kPinnedStep = 6;

class PinnedTrainingTest : public ::testing::Test {
 protected:
  // The pinned job, checkpointing into `dir`.
  std::string WriteJob(const std::string& dir) {
    std::ifstream in(std::string(DIFFTRAIN_SOURCE_DIR) + "/tests/data/pinned/job.yaml");
    std::stringstream text;
    text << in.rdbuf();
    std::string yaml = text.str();
    const std::string section = "checkpoint:\n";
    yaml.replace(yaml.find(section), section.size(), section + "  dir: " + dir + "\n");
    const std::string path = tmp_.path() + "/job.yaml";
    std::ofstream(path) << yaml;
    return path;
  }

  uint64_t Train(const std::string& dir) {
    const std::string job = WriteJob(dir);
    const testing::CommandResult r = testing::RunCommand(
        "OMP_NUM_THREADS=2 OPENBLAS_CORETYPE=Haswell " + std::string(DIFFTRAIN_BINARY) +
        " train --config " + testing::ShellQuote(job));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    int64_t step = -1;
    const auto tensors = testing::NewestCheckpointTensors(dir, &step);
    EXPECT_EQ(step, kPinnedStep);
    EXPECT_FALSE(tensors.empty());
    return Checksum(tensors);
  }

  TempDir tmp_{"pinned"};
};

TEST_F(PinnedTrainingTest, TrainsToTheRecordedCheckpoint) {
  const uint64_t got = Train(tmp_.path() + "/checkpoints");
  EXPECT_EQ(got, kPinnedChecksum) << "checksum 0x" << std::hex << got;
}

TEST_F(PinnedTrainingTest, ResumesACheckpointWrittenBeforeTheRefactor) {
  const std::string dir = tmp_.path() + "/checkpoints";
  fs::copy(std::string(DIFFTRAIN_SOURCE_DIR) + "/tests/data/pinned/checkpoint", dir,
           fs::copy_options::recursive);
  const uint64_t got = Train(dir);
  EXPECT_EQ(got, kResumedChecksum) << "checksum 0x" << std::hex << got;
}

}  // namespace
}  // namespace difftrain
