// One training process's model, optimizer and data position: the DiT training step.
//
// Every random draw is addressed by the global index n of the training sample: sample n's
// image comes from the data loader (a permutation per epoch, from the seed), and its
// timestep, label dropout and noise from Rng(seed, kNoise, n). Step s consumes samples [s·G,
// (s+1)·G) for global batch G. So the whole training state is the arenas plus (step, samples seen),
// and resuming from a checkpoint continues bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/data/dataset.h"
#include "model/data/loader.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/dit/dit.h"
#include "model/io/safetensors.h"
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
};

class Trainer {
 public:
  // Opens the dataset of config.data and checks that its samples fit the model.
  static Result<std::unique_ptr<Trainer>> Create(const TrainConfig& config);
  // Initialises the model as the reference does, from config.seed; `data` must fit the model.
  Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data);

  // Builds the micro-batch of global samples [first, first + B).
  Status MakeMicroBatch(int64_t first, int B, MicroBatch& batch);
  // Forward, ε-MSE loss and backward of one micro-batch; gradients accumulate, scaled by
  // grad_scale. Returns the (unscaled) loss.
  double ForwardBackward(const MicroBatch& batch, float grad_scale);
  // One optimizer step over the next global batch of the data.
  Result<StepStats> Step();
  // One optimizer step on exactly this batch (no accumulation), e.g. to overfit it.
  StepStats StepOn(const MicroBatch& batch);

  // The checkpoint shard of this process: model (reference names, pos_embed included), EMA
  // (`ema.` prefix), AdamW moments (`optim.exp_avg.`, `optim.exp_avg_sq.`) and, in the
  // metadata, step, samples seen, seed and the configs. Pointers stay valid while the
  // Trainer lives and does not step.
  void AddToCheckpoint(io::SafetensorsWriter& shard) const;
  // Restores everything AddToCheckpoint wrote; a shard from another model or run shape is
  // an error naming what differs.
  Status RestoreFromCheckpoint(const io::SafetensorsFile& shard);

  DiT& model() { return model_; }
  const DiT& model() const { return model_; }
  const float* ema() const { return ema_.data(); }
  const float* last_output() const { return last_output_; }
  const TrainConfig& config() const { return config_; }
  int64_t step() const { return step_; }
  int64_t samples_seen() const { return samples_seen_; }

 private:
  // Clips, updates the parameters with AdamW and the EMA, and advances the counters.
  StepStats ApplyUpdate(double loss, int64_t samples);

  TrainConfig config_;
  std::unique_ptr<Dataset> data_;
  DataLoader loader_;
  DiT model_;
  GaussianDiffusion diffusion_;
  Buffer<float> ema_, exp_avg_, exp_avg_sq_;
  std::vector<float> dout_;
  const float* last_output_ = nullptr;
  MicroBatch batch_;
  int64_t step_ = 0;
  int64_t samples_seen_ = 0;
};

}  // namespace difftrain
