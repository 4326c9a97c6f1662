// One training process's model, optimizer and data position: the DiT training step, alone
// or as one rank of a data-parallel group.
//
// Every random draw is addressed by the global index n of the training sample: sample n's
// image comes from the data loader (a permutation per epoch, from the seed), and its
// timestep, label dropout and noise from Rng(seed, kNoise, n). Step s consumes samples
// [s·G, (s+1)·G) for global batch G; data-parallel rank r takes the r-th contiguous slice
// of them. So the whole training state is the arenas plus (step, samples seen), resuming
// continues bit for bit, and dp ranks compute what one process would.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/data/dataset.h"
#include "model/data/loader.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/dit/dit.h"
#include "model/io/safetensors.h"
#include "model/parallel/grad_sync.h"
#include "model/train/train_config.h"

namespace difftrain {

// The inputs of a micro-batch as the model sees them.
struct MicroBatch {
  int size = 0;
  std::vector<float> x0, noise, x_t;  // [B, C, H, W]
  std::vector<int64_t> t;             // timesteps
  std::vector<float> t_float;         // the same, as the model's input
  std::vector<int32_t> y;             // labels after dropout (num_classes = null class)
};

struct StepStats {
  int64_t step = 0;  // optimizer steps done after this one
  double loss = 0;   // mean over the global batch
  double grad_norm = 0;
  double lr = 0;
  double comm_wait_seconds = 0;  // waiting for gradient reduction after backward
};

// A rank's data-parallel group. Without a communicator the trainer is one process.
struct DataParallelOptions {
  parallel::Comm* comm = nullptr;
  bool zero1 = false;
  bool overlap = true;  // start a bucket's reduction as soon as its gradients are final
  size_t bucket_elements = size_t{1} << 20;
};

class Trainer {
 public:
  // Opens the dataset of config.data and checks that its samples fit the model.
  static Result<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                 const DataParallelOptions& dp = {});
  // Initialises the model as the reference does, from config.seed; `data` must fit the model.
  Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data,
          const DataParallelOptions& dp = {});

  // Builds the micro-batch of global samples [first, first + B).
  Status MakeMicroBatch(int64_t first, int B, MicroBatch& batch);
  // Forward, loss and backward of one micro-batch; gradients accumulate, scaled by
  // grad_scale. Returns the (unscaled) loss.
  double ForwardBackward(const MicroBatch& batch, float grad_scale,
                         const DiT::GradientsReady& ready = {});
  // One optimizer step over this rank's share of the next global batch.
  Result<StepStats> Step();
  // One optimizer step on exactly this batch, in one process (no accumulation, no data
  // parallelism), e.g. to overfit it.
  StepStats StepOn(const MicroBatch& batch);

  // This rank's checkpoint shard. Rank 0 writes the model (reference names, pos_embed
  // included) and the EMA (`ema.` prefix); every rank writes the AdamW moments of the
  // arena ranges it owns (`optim.exp_avg`, `optim.exp_avg_sq`, ranges in the metadata),
  // so a checkpoint of one data-parallel size and ZeRO setting loads into any other.
  // Pointers stay valid while the Trainer lives and does not step.
  void AddToCheckpoint(io::SafetensorsWriter& shard) const;
  // Restores model, EMA, counters and the data position from shard 0 of a checkpoint.
  Status RestoreModel(const io::SafetensorsFile& shard0);
  // Copies the moments of every owned range that `shard` holds; returns the elements copied.
  Result<size_t> RestoreOptimizer(const io::SafetensorsFile& shard);
  // Elements of AdamW moments this rank holds (its owned ranges).
  size_t optimizer_elements() const { return owned_elements_; }

  DiT& model() { return model_; }
  const DiT& model() const { return model_; }
  const float* ema() const { return ema_.data(); }
  const float* last_output() const { return last_output_; }
  const TrainConfig& config() const { return config_; }
  int dp_rank() const { return dp_.comm ? dp_.comm->rank() : 0; }
  int dp_size() const { return dp_.comm ? dp_.comm->size() : 1; }
  int64_t step() const { return step_; }
  int64_t samples_seen() const { return samples_seen_; }

 private:
  // Clips, updates the owned parameters with AdamW, gathers them (ZeRO-1), updates the
  // EMA and advances the counters.
  Result<StepStats> ApplyUpdate(double loss, int64_t samples, bool synchronised);
  const std::vector<parallel::Range>& owned() const;

  TrainConfig config_;
  DataParallelOptions dp_;
  std::unique_ptr<Dataset> data_;
  DataLoader loader_;
  DiT model_;
  GaussianDiffusion diffusion_;
  std::unique_ptr<parallel::GradientSync> sync_;
  std::vector<parallel::Range> whole_;  // [0, n): what one process owns
  size_t owned_elements_ = 0;
  Buffer<float> ema_, exp_avg_, exp_avg_sq_;
  std::vector<float> dout_;
  const float* last_output_ = nullptr;
  MicroBatch batch_;
  int64_t step_ = 0;
  int64_t samples_seen_ = 0;
};

}  // namespace difftrain
