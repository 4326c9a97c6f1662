// The Trainer with train.device cuda (model/train/gpu_step.h) against the CPU Trainer: the
// same samples, loss (learn_sigma's vb term and min-SNR weighting included) and optimizer,
// step after step; resuming from its own checkpoint; its data-parallel group over NCCL, of
// one GPU and, where there are two, of two against one GPU accumulating the same batch.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/cuda/testing.h"
#include "model/parallel/gloo_comm.h"
#include "model/parallel/store.h"
#include "model/train/checkpointing.h"
#include "model/train/gpu_step.h"
#include "model/train/trainer.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

using ::testing::HasSubstr;

TrainConfig TinyConfig() {
  TrainConfig c = testing::TinyTrainConfig(/*hidden_size=*/64);  // head dim 16
  c.learn_sigma_loss = true;
  c.diffusion.loss_weighting = "min_snr";
  c.optimizer.lr = 3e-3;
  c.seed = 7;
  return c;
}

std::unique_ptr<Trainer> GpuTrainer(TrainConfig c, const ParallelOptions& parallel = {},
                                    int device = 0) {
  c.device = "cuda";
  Result<std::unique_ptr<GpuStep>> gpu = GpuStep::Create(c, device);
  EXPECT_TRUE(gpu.ok()) << gpu.status().message();
  return std::make_unique<Trainer>(c, testing::SyntheticData(c), parallel, std::move(gpu).value());
}

double Relative(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

// `steps` steps of each: the GPU's loss and gradient norm within bf16's error of the CPU's.
void ExpectStepsFollow(Trainer& cpu, Trainer& gpu, int steps) {
  for (int step = 1; step <= steps; ++step) {
    Result<StepStats> want = cpu.Step();
    Result<StepStats> got = gpu.Step();
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_LE(Relative(got->loss, want->loss), 2e-2) << "step " << step;
    EXPECT_LE(Relative(got->grad_norm, want->grad_norm), 5e-2) << "step " << step;
    EXPECT_EQ(got->lr, want->lr);
  }
}

class GpuTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gpu_trainer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes and commits the trainer's checkpoint (one process) under dir_/name.
  void Save(Trainer& trainer, const std::string& name) {
    const io::CheckpointStore store((dir_ / name).string(), /*keep=*/1);
    ASSERT_TRUE(WriteCheckpointShard(trainer, store, 0, 1).ok());
    ASSERT_TRUE(store.Commit(trainer.step(), 1).ok());
  }
  void Restore(Trainer& trainer, const std::string& name) {
    const io::CheckpointStore store((dir_ / name).string(), /*keep=*/1);
    Result<std::optional<int64_t>> step = RestoreLatestCheckpoint(trainer, store);
    ASSERT_TRUE(step.ok()) << step.status().message();
    ASSERT_TRUE(step->has_value());
  }

  std::filesystem::path dir_;
};

// From the same random weights (the reference zero-initialises the adaLN and output layers,
// which would hide most of the model for the first steps), the GPU's steps follow the CPU's:
// loss and gradient norm within bf16's error, and the parameters after them.
TEST_F(GpuTrainerTest, StepsFollowTheCpuTrainer) {
  DT_SKIP_WITHOUT_GPU();
  const TrainConfig c = TinyConfig();
  Trainer cpu(c, testing::SyntheticData(c));
  cpu.model().InitializeRandom(/*seed=*/3);
  Save(cpu, "start");
  std::unique_ptr<Trainer> gpu = GpuTrainer(c);
  Restore(*gpu, "start");
  ExpectStepsFollow(cpu, *gpu, 6);
  Save(*gpu, "end");  // downloads the device's parameters into the host arenas
  const std::vector<float> want(cpu.model().params(),
                                cpu.model().params() + cpu.model().num_params());
  const std::vector<float> got(gpu->model().params(),
                               gpu->model().params() + gpu->model().num_params());
  EXPECT_LE(cuda::testing::RelativeL2(got, want), 1e-2);
}

// A checkpoint written from the GPU and restored into a new GPU trainer continues the run:
// the next step is the one the first trainer takes.
TEST_F(GpuTrainerTest, ResumesFromItsOwnCheckpoint) {
  DT_SKIP_WITHOUT_GPU();
  const TrainConfig c = TinyConfig();
  std::unique_ptr<Trainer> first = GpuTrainer(c);
  for (int step = 0; step < 3; ++step)  // the third is a graph replay
    ASSERT_TRUE(first->Step().ok());
  Save(*first, "ckpt");
  Result<StepStats> want = first->Step();
  std::unique_ptr<Trainer> resumed = GpuTrainer(c);
  Restore(*resumed, "ckpt");
  EXPECT_EQ(resumed->step(), 3);
  Result<StepStats> got = resumed->Step();
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->step, 4);
  // Only the order of the attention backward's atomic additions differs.
  EXPECT_LE(Relative(got->loss, want->loss), 1e-3);
  EXPECT_LE(Relative(got->grad_norm, want->grad_norm), 1e-3);
}

// checkpoint.init_from on the GPU: the weights reach the device before the first step, which
// is then the CPU trainer's from the same weights (another run's random weights, so that the
// seed's zero-initialised layers would not pass for them).
TEST_F(GpuTrainerTest, StartsFromInitialWeightsAsTheCpuTrainerDoes) {
  DT_SKIP_WITHOUT_GPU();
  const TrainConfig c = TinyConfig();
  Trainer source(c, testing::SyntheticData(c));
  source.model().InitializeRandom(/*seed=*/3);
  Save(source, "source");
  TrainConfig other = c;
  other.seed = 8;
  Trainer cpu(other, testing::SyntheticData(other));
  std::unique_ptr<Trainer> gpu = GpuTrainer(other);
  for (Trainer* t : {&cpu, gpu.get()}) {
    Result<std::string> from = InitializeFromWeights(*t, (dir_ / "source").string());
    ASSERT_TRUE(from.ok()) << from.status().message();
  }
  ExpectStepsFollow(cpu, *gpu, 2);
}

// Rank `rank` of a data-parallel group of `dp` over NCCL (its GPU `rank`), the world over
// Gloo, as `difftrain train` forms them; returns each step's stats.
std::vector<StepStats> RunDataParallelRank(const TrainConfig& c, const std::string& store_dir,
                                           int rank, int dp, int steps) {
  Result<parallel::FileStore> opened = parallel::FileStore::Open(store_dir);
  EXPECT_TRUE(opened.ok()) << opened.status().message();
  if (!opened.ok()) return {};
  parallel::FileStore& store = *opened;
  const auto timeout = std::chrono::seconds(60);
  std::vector<int> ranks(dp);
  for (int r = 0; r < dp; ++r)
    ranks[r] = r;
  TrainConfig config = c;
  config.device = "cuda";
  Result<std::unique_ptr<GpuStep>> gpu = GpuStep::Create(config, rank);
  EXPECT_TRUE(gpu.ok()) << gpu.status().message();
  Result<std::unique_ptr<parallel::Comm>> nccl =
      (*gpu)->JoinGroup(store, "test/dp", rank, dp, ranks, timeout);
  Result<std::unique_ptr<parallel::Comm>> gloo =
      parallel::CreateGlooComm(store, "test/world", rank, dp, ranks, timeout);
  EXPECT_TRUE(nccl.ok()) << nccl.status().message();
  EXPECT_TRUE(gloo.ok()) << gloo.status().message();
  if (!nccl.ok() || !gloo.ok()) return {};
  ParallelOptions p;
  p.topology = Topology::Create(1, 1, dp, 1).value();
  p.rank = rank;
  p.dp_cp = nccl->get();
  p.world = gloo->get();
  Trainer trainer(config, testing::SyntheticData(config), p, std::move(gpu).value());
  std::vector<StepStats> stats;
  for (int step = 0; step < steps; ++step) {
    Result<StepStats> s = trainer.Step();
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) break;
    stats.push_back(*s);
  }
  return stats;
}

// A micro-batch the GPU cannot hold stops with the reason before any step, and leaves the
// GPU usable.
TEST_F(GpuTrainerTest, MicroBatchBeyondTheGpuIsAnError) {
  DT_SKIP_WITHOUT_GPU();
  TrainConfig c;
  c.model = DiTSpec(DiTConfigByName("DiT-XL/2").value());
  c.micro_batch = c.global_batch = 8192;  // terabytes of activations
  c.device = "cuda";
  Result<std::unique_ptr<GpuStep>> gpu = GpuStep::Create(c, 0);
  ASSERT_FALSE(gpu.ok());
  EXPECT_THAT(gpu.status().message(), HasSubstr("DiT-XL/2 at batch.micro 8192"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("the activations of a micro-batch of 8192"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("Lower batch.micro"));

  std::unique_ptr<Trainer> tiny = GpuTrainer(TinyConfig());
  Result<StepStats> step = tiny->Step();
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_TRUE(std::isfinite(step->loss));
}

// The group of one that `difftrain train --world 1 --store DIR` forms: an NCCL all-reduce of
// one rank leaves the gradients as they are.
TEST_F(GpuTrainerTest, DataParallelGroupOfOneMatchesOneProcess) {
  DT_SKIP_WITHOUT_GPU();
  const TrainConfig c = TinyConfig();
  const std::vector<StepStats> got = RunDataParallelRank(c, (dir_ / "store").string(), 0, 1, 3);
  std::unique_ptr<Trainer> alone = GpuTrainer(c);
  ASSERT_EQ(got.size(), 3u);
  for (const StepStats& g : got) {
    Result<StepStats> want = alone->Step();
    ASSERT_TRUE(want.ok());
    EXPECT_LE(Relative(g.loss, want->loss), 1e-3) << "step " << g.step;
    EXPECT_LE(Relative(g.grad_norm, want->grad_norm), 1e-3) << "step " << g.step;
  }
}

// Two GPUs, each with one micro-batch of the global batch of 8, against one GPU that
// accumulates both micro-batches: the same samples, the same averaged gradient.
TEST_F(GpuTrainerTest, TwoGpusMatchOneAccumulating) {
  DT_SKIP_WITHOUT_GPU();
  int count = 0;
  DT_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "GPU test skipped: needs 2 GPUs, this machine has " << count;
  const TrainConfig c = TinyConfig();
  std::vector<StepStats> ranks[2];
  std::thread peer([&] { ranks[1] = RunDataParallelRank(c, (dir_ / "store").string(), 1, 2, 3); });
  ranks[0] = RunDataParallelRank(c, (dir_ / "store").string(), 0, 2, 3);
  peer.join();
  std::unique_ptr<Trainer> alone = GpuTrainer(c);
  ASSERT_EQ(ranks[0].size(), 3u);
  ASSERT_EQ(ranks[1].size(), 3u);
  for (int step = 0; step < 3; ++step) {
    Result<StepStats> want = alone->Step();
    ASSERT_TRUE(want.ok());
    for (const auto& rank : ranks) {
      EXPECT_LE(Relative(rank[step].loss, want->loss), 1e-3) << "step " << step + 1;
      EXPECT_LE(Relative(rank[step].grad_norm, want->grad_norm), 1e-3) << "step " << step + 1;
    }
  }
}

}  // namespace
}  // namespace difftrain
