// Checks difftrain's TensorBoard event files (model/io/tensorboard.h, train.tensorboard_dir) with
// TensorBoard's own reader (tests/reference/tensorboard_events.py, EventAccumulator): scalars and
// a PNG image as written, a restart's SessionLog dropping the steps it retrains, and a training
// run's per-step loss, gradient norm and learning rate equal to its metrics file's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/png.h"
#include "model/io/tensorboard.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/tiny_training.h"

namespace difftrain::testing {
namespace {

class TensorBoardReferenceTest : public TensorBoardReference {
 protected:
  // What TensorBoard reads of the event files in `dir`.
  nlohmann::json Read(const std::filesystem::path& dir) {
    const std::string out = (dir_ / "read.json").string();
    const CommandResult r =
        RunScript("tensorboard_events.py", ShellQuote(dir.string()) + " " + ShellQuote(out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(out);
    return nlohmann::json::parse(in);
  }
};

std::string Hex(const std::string& bytes) {
  std::string hex;
  for (unsigned char c : bytes)
    hex += fmt::format("{:02x}", c);
  return hex;
}

TEST_F(TensorBoardReferenceTest, ReadsScalarsImagesAndDropsWhatARestartRetrains) {
  const std::filesystem::path logs = dir_ / "logs";
  std::vector<uint8_t> pixels(5 * 3 * 3);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<uint8_t>(i * 17);
  const std::string png_path = (dir_ / "picture.png").string();
  ASSERT_TRUE(io::WritePng(png_path, pixels.data(), 5, 3, 3).ok());
  std::ifstream png_in(png_path, std::ios::binary);
  const std::string png((std::istreambuf_iterator<char>(png_in)), std::istreambuf_iterator<char>());
  {
    // A first attempt logs steps 1 to 4 and dies; the second resumes from step 2's checkpoint.
    Result<io::TensorBoardWriter> first = io::TensorBoardWriter::Open(logs.string());
    ASSERT_TRUE(first.ok()) << first.status().message();
    ASSERT_TRUE(first->Restart(1).ok());
    for (int step = 1; step <= 4; ++step)
      ASSERT_TRUE(first->Scalars(step, {{"train/loss", 1.0 / step}, {"train/lr", 1e-4}}).ok());
    Result<io::TensorBoardWriter> second = io::TensorBoardWriter::Open(logs.string());
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE(second->Restart(3).ok());
    ASSERT_TRUE(second->Scalars(3, {{"train/loss", 0.25}, {"train/lr", 2e-4}}).ok());
    ASSERT_TRUE(second->Image(3, "samples", png, 3, 5, 3).ok());
  }
  const nlohmann::json read = Read(logs);
  ASSERT_EQ(read["files"].size(), 2u);
  const nlohmann::json& loss = read["scalars"]["train/loss"];
  ASSERT_EQ(loss.size(), 3u) << read.dump();  // steps 1, 2, and the second attempt's 3
  EXPECT_EQ(loss[0][0], 1);
  EXPECT_EQ(loss[0][1], 1.0);
  EXPECT_EQ(loss[1][1], 0.5);
  EXPECT_EQ(loss[2][0], 3);
  EXPECT_EQ(loss[2][1], 0.25);
  EXPECT_EQ(read["scalars"]["train/lr"][2][1].get<double>(), static_cast<double>(2e-4f));
  const nlohmann::json& images = read["images"]["samples"];
  ASSERT_EQ(images.size(), 1u);
  EXPECT_EQ(images[0][0], 3);
  EXPECT_EQ(images[0][1], 5);  // width
  EXPECT_EQ(images[0][2], 3);  // height
  EXPECT_EQ(images[0][3], Hex(png));
}

TEST_F(TensorBoardReferenceTest, ATrainingRunLogsEveryStepsMetricsFromRankZero) {
  const std::filesystem::path logs = dir_ / "tb";
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  std::ofstream(dir_ / "job.yaml")
      << kTinyGreyJobYaml
      << "optimizer: {lr: 0.001, lr_schedule: diffusers_linear, "
         "warmup_steps: 2}\n"
      << "train: {steps: 5, log_every: 1, metrics_file: " << metrics
      << ", tensorboard_dir: " << logs.string() << "}\n"
      << "checkpoint: {dir: " << (dir_ / "ckpt").string() << ", every: 2}\n";
  const CommandResult train =
      RunDifftrain("train --config " + ShellQuote((dir_ / "job.yaml").string()));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const nlohmann::json read = Read(logs);
  std::ifstream in(metrics);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 5u);
  for (const char* tag : {"loss", "grad_norm", "lr"}) {
    SCOPED_TRACE(tag);
    const nlohmann::json& logged = read["scalars"][std::string("train/") + tag];
    ASSERT_EQ(logged.size(), lines.size()) << read.dump();
    for (size_t i = 0; i < lines.size(); ++i) {
      EXPECT_EQ(logged[i][0], lines[i]["step"]);
      EXPECT_EQ(logged[i][1].get<double>(),
                static_cast<double>(static_cast<float>(lines[i][tag].get<double>())));
    }
  }
  EXPECT_EQ(read["scalars"]["train/lr"][0][1], 0.0);  // diffusers' warm-up starts at 0
  for (const char* tag : {"perf/samples_per_second", "perf/step_seconds", "perf/mfu"})
    EXPECT_EQ(read["scalars"][tag].size(), 5u) << tag;

  // `sample --watch --tensorboard` logs each checkpoint's grid, as its step's image, in a run
  // of its own beside the training's.
  const CommandResult watched = RunDifftrain(
      "sample --checkpoint " + ShellQuote((dir_ / "ckpt").string()) +
      " --watch --watch-timeout 30 --classes 1,2 --per-class 2 --sampler ddim --steps 2 --out " +
      ShellQuote((dir_ / "grid.png").string()) + " --tensorboard " + ShellQuote(logs.string()));
  ASSERT_EQ(watched.exit_code, 0) << watched.output;
  const nlohmann::json samples = Read(logs / "samples");
  const nlohmann::json& images = samples["images"]["samples"];
  ASSERT_EQ(images.size(), 3u) << samples.dump();  // steps 5, 4 and 2: the newest first
  for (size_t i = 0; i < 3; ++i) {
    const int step = std::vector<int>{5, 4, 2}[i];
    EXPECT_EQ(images[i][0], step);
    std::ifstream grid(dir_ / fmt::format("grid-step-{:08d}.png", step), std::ios::binary);
    EXPECT_EQ(images[i][3], Hex(std::string(std::istreambuf_iterator<char>(grid),
                                            std::istreambuf_iterator<char>())));
  }
}

}  // namespace
}  // namespace difftrain::testing
