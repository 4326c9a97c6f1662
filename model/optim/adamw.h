// AdamW (PyTorch's semantics), global-norm gradient clipping, the learning-rate schedule
// (linear warm-up, then constant or cosine decay), and the EMA of the weights. Each works on a flat
// range of the parameter arena, so the full model and a ZeRO-1 shard are updated by the same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/optim/adamw_scalars.h"

namespace difftrain {

struct OptimizerConfig {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;  // linear warm-up from lr/warmup to lr
  // constant: lr after the warm-up. cosine: lr · ½(1 + cos(π · step / steps)) over the run.
  std::string lr_schedule = "constant";
  double grad_clip = 0.0;  // max global gradient norm; 0 disables clipping
  double ema_decay = 0.9999;
  // constant: every step's EMA decays by ema_decay (DiT's). diffusers: diffusers' EMAModel's
  // default schedule (train_text_to_image.py's --use_ema), min(ema_decay, (1 + s)/(10 + s)) at
  // optimizer step s + 1, 0 at the first (EmaDecayAt).
  std::string ema_schedule = "constant";

  Status Validate() const;
  nlohmann::json ToJson() const;
};

// Learning rate of optimizer step `step` (0-based) of a run of `total_steps`:
// lr · min(1, (step + 1) / warmup_steps), times ½(1 + cos(π · step / total_steps)) when
// `cosine`. A warm-up of 0 steps is none.
double ScheduledLearningRate(double lr, double warmup_steps, bool cosine, int64_t step,
                             int64_t total_steps);
// ScheduledLearningRate under `config`.
double LearningRate(const OptimizerConfig& config, int64_t step, int64_t total_steps);

// Sum of squares of g[0..n) in double precision (the caller takes the square root after
// adding the partial sums of every shard).
double SumOfSquares(const float* g, size_t n);

// The factor that scales gradients of global norm `norm` down to `max_norm` (1 when not
// clipping), as torch.nn.utils.clip_grad_norm_ computes it.
double ClipScale(double norm, double max_norm);

// The scalars of AdamW step `step` (1-based, for bias correction) at learning rate lr.
AdamWScalars AdamWScalarsAt(double lr, int64_t step, const OptimizerConfig& config);

// One AdamW step on n parameters; `step` is the 1-based step count used by bias correction.
// The gradient is multiplied by grad_scale first (clipping).
void AdamWUpdate(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t n,
                 double lr, double grad_scale, int64_t step, const OptimizerConfig& config);

// The EMA's decay at optimizer step `step` (1-based) under config.ema_schedule: ema_decay, or
// diffusers' EMAModel.get_decay (use_ema_warmup off, update_after_step 0, min_decay 0): 0 at
// step 1 (the average starts at the weights after it), then min(ema_decay, (1 + s)/(10 + s))
// with s = step − 1, which reaches 0.9999 only after 90,000 steps.
double EmaDecayAt(const OptimizerConfig& config, int64_t step);

// ema = decay · ema + (1 − decay) · params
void EmaUpdate(float* ema, const float* params, size_t n, double decay);

}  // namespace difftrain
