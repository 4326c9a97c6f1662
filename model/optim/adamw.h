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
  int64_t warmup_steps = 0;  // linear warm-up from lr/warmup to lr (diffusers_*: from 0)
  // constant: lr after the warm-up. cosine: lr · ½(1 + cos(π · step / steps)) over the run.
  // diffusers_NAME: diffusers' get_scheduler(NAME) (diffusers.optimization, 0.27.2) for NAME in
  // constant, constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial
  // (DiffusersLrFactor).
  std::string lr_schedule = "constant";
  int64_t lr_num_cycles = 1;  // diffusers_cosine_with_restarts: the number of cosine cycles
  double lr_power = 1.0;      // diffusers_polynomial: the decay's power, to lr_end 1e-7
  double grad_clip = 0.0;     // max global gradient norm; 0 disables clipping
  double ema_decay = 0.9999;
  // constant: every step's EMA decays by ema_decay (DiT's). diffusers: diffusers' EMAModel's
  // default schedule (train_text_to_image.py's --use_ema), min(ema_decay, (1 + s)/(10 + s)) at
  // optimizer step s + 1, 0 at the first (EmaDecayAt).
  // diffusers_warmup: EMAModel's use_ema_warmup (train_unconditional.py's --use_ema),
  // min(ema_decay, 1 − (1 + s/ema_inv_gamma)^−ema_power), 0 at the first step.
  std::string ema_schedule = "constant";
  double ema_inv_gamma = 1.0;
  double ema_power = 2.0 / 3.0;

  Status Validate() const;
  nlohmann::json ToJson() const;
};

// The polynomial schedule's final rate (get_scheduler's default lr_end).
inline constexpr double kDiffusersPolynomialLrEnd = 1e-7;

// Learning rate of optimizer step `step` (0-based) of a run of `total_steps`:
// lr · min(1, (step + 1) / warmup_steps), times ½(1 + cos(π · step / total_steps)) when
// `cosine`. A warm-up of 0 steps is none.
double ScheduledLearningRate(double lr, double warmup_steps, bool cosine, int64_t step,
                             int64_t total_steps);

// The factor diffusers' LambdaLR of get_scheduler(`name`, num_warmup_steps = warmup_steps,
// num_training_steps = total_steps, num_cycles = lr_num_cycles, power = lr_power) gives the
// rate of optimizer step `step` (0-based: the first step's factor is lambda(0), 0 under a
// warm-up). Under accelerate the script scales the warm-up and the total by the process count
// and steps the scheduler that many times an optimizer step, which comes to the same factor.
double DiffusersLrFactor(const OptimizerConfig& config, const std::string& name, int64_t step,
                         int64_t total_steps);

// The learning rate of step `step` (0-based) under `config`: ScheduledLearningRate for
// constant and cosine, lr · DiffusersLrFactor for diffusers_*.
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
// diffusers' EMAModel.get_decay (update_after_step 0, min_decay 0): 0 at step 1 (the average
// starts at the weights after it), then with s = step − 1 min(ema_decay, (1 + s)/(10 + s))
// (`diffusers`, which reaches 0.9999 only after 90,000 steps) or
// min(ema_decay, 1 − (1 + s/ema_inv_gamma)^−ema_power) (`diffusers_warmup`).
double EmaDecayAt(const OptimizerConfig& config, int64_t step);

// ema = decay · ema + (1 − decay) · params
void EmaUpdate(float* ema, const float* params, size_t n, double decay);

}  // namespace difftrain
