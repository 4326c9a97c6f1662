// `difftrain sample --watch` as a user runs it beside a training run: started before the run's
// first checkpoint, it samples each step as it is published, exactly as `sample --checkpoint
// STEP` would, stops at the run's last step, skips what an earlier watcher sampled, and gives
// up after --watch-timeout without a checkpoint. (launch/ is the binary's: its tests run it.)
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/io/safetensors.h"
#include "tests/testing/run_command.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

// 8×8 grey images of 10 classes, four steps with a checkpoint every two.
const std::string kJob =
    std::string(testing::kTinyGreyJobYaml) + "train:\n  steps: 4\n  log_every: 1\n";

// The samples of `raw`'s file, as floats.
std::vector<float> Images(const std::string& raw) {
  Result<io::SafetensorsFile> f = io::SafetensorsFile::Read(raw);
  std::vector<float> x(2 * 8 * 8);
  EXPECT_TRUE(f.ok() && f->CopyF32("images", {2, 1, 8, 8}, x.data()).ok()) << raw;
  return x;
}

TEST(SampleWatchTest, SamplesEachCheckpointOfARunAsItIsWritten) {
  TempDir temp("sample_watch_test");
  const std::filesystem::path dir = temp.path();
  const std::filesystem::path ckpt = dir / "ckpt";
  std::ofstream(dir / "job.yaml") << kJob << "checkpoint:\n  dir: " << ckpt.string()
                                  << "\n  every: 2\n  keep: 3\n";
  const std::string how =
      " --classes 1 --per-class 2 --sampler ddim --steps 3 --seed 5 --weights model "
      "--clip-denoised false";
  const std::string watch_args = "sample --checkpoint " + ShellQuote(ckpt.string()) +
                                 " --watch --watch-timeout 30" + how + " --out " +
                                 ShellQuote((dir / "grid.png").string()) + " --raw " +
                                 ShellQuote((dir / "raw.safetensors").string());
  // The watcher starts first, on a directory that does not exist yet.
  CommandResult watched;
  std::thread watcher([&] { watched = RunDifftrain(watch_args); });
  const CommandResult train =
      RunDifftrain("train --config " + ShellQuote((dir / "job.yaml").string()));
  watcher.join();
  ASSERT_EQ(train.exit_code, 0) << train.output;
  ASSERT_EQ(watched.exit_code, 0) << watched.output;
  EXPECT_NE(watched.output.find("the run's last step 4 is sampled"), std::string::npos)
      << watched.output;
  for (const char* step : {"00000002", "00000004"}) {
    SCOPED_TRACE(step);
    EXPECT_TRUE(std::filesystem::exists(dir / (std::string("grid-step-") + step + ".png")));
    // What `sample --checkpoint` makes of the step on its own, bit for bit.
    const std::string alone = (dir / (std::string("alone-") + step + ".safetensors")).string();
    const CommandResult r = RunDifftrain(
        "sample --checkpoint " + ShellQuote((ckpt / (std::string("step-") + step)).string()) + how +
        " --raw " + ShellQuote(alone));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Images((dir / (std::string("raw-step-") + step + ".safetensors")).string()),
              Images(alone));
  }
  EXPECT_NE(Images((dir / "raw-step-00000002.safetensors").string()),
            Images((dir / "raw-step-00000004.safetensors").string()));

  // A second watcher finds both steps sampled and stops at once.
  const CommandResult again = RunDifftrain(watch_args);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("step 4 was sampled before; skipped"), std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("sampling step"), std::string::npos) << again.output;
}

TEST(SampleWatchTest, GivesUpWithoutACheckpointAndRefusesBadInput) {
  TempDir temp("sample_watch_test");
  const std::filesystem::path root = temp.path();
  std::filesystem::create_directories(root / "step-00000002");
  std::ofstream(root / "step-00000002" / "manifest.json") << "{}";
  const std::string none = (root / "none").string();
  const std::string out = " --out " + ShellQuote((root / "g.png").string());
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"--checkpoint " + ShellQuote(none) + " --watch --watch-timeout 1", 1,
            "no new checkpoint in " + none + " for 1 s (--watch-timeout); stopping"},
           {"--checkpoint " + ShellQuote((root / "step-00000002").string()) + " --watch", 2,
            "--watch takes a run's checkpoint directory, and"},
           {"--checkpoint " + ShellQuote(none) + " --watch --watch-timeout 0", 2,
            "--watch-timeout must be positive, got 0"},
           {"--pretrained " + ShellQuote(none) + " --watch", 2,
            "--watch watches a run's --checkpoint directory"},
           {"--checkpoint " + ShellQuote(none) + " --tensorboard " + ShellQuote(none), 2,
            "--tensorboard logs what --watch samples: add --watch"}}) {
    const CommandResult r = RunDifftrain("sample " + c.args + out);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace difftrain
