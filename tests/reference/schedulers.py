#!/usr/bin/python3
"""diffusers' DDIMScheduler and DDPMScheduler as the reference of difftrain's samplers with a
diffusers timestep spacing (model/diffusion/timestep_spacing.h, sampler.h):

    PYTHON tests/reference/schedulers.py timesteps OUT.json T
    PYTHON tests/reference/schedulers.py steps CASES.json OUT.safetensors

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).

timesteps: for each spacing (leading with steps_offset 0 and 1, trailing, linspace) and each
N in 1 … T, the timesteps DDIMScheduler.set_timesteps(N) lists, as
{"leading/0": [[t, ...] for N = 1 … T], ...}.

steps: CASES.json is a list of {"name", "scheduler": a scheduler config, "steps": N}. For each
case, with DDIMScheduler(**scheduler) and DDPMScheduler(**scheduler without DDIM's keys):
  NAME.timesteps   [N] the timesteps, decreasing, as floats
  NAME.x_T         [2, 2, 4, 4] N(0, 1) (seeded by the case's index)
  NAME.ddim        x_T denoised by DDIMScheduler.step (eta 0) with the model below
  NAME.ddim_abar   [N, 2] each DDIM step's ᾱ_t and ᾱ_prev (final_alpha_cumprod below 0)
  NAME.pndm        (not with rescale_betas_zero_snr, which PNDM lacks) x_T denoised by PNDMScheduler.from_config(scheduler, skip_prk_steps=True),
                   in float64 with the schedule's ᾱ's computed in float64 (PNDM's transfer
                   scales x by √(ᾱ_prev/ᾱ_t): diffusers' fp32 ᾱ's, whose cumulative product
                   drifts by 1.3e-5 at t = 999, move the 7-step cosine sample by 1.4e-3 from
                   the same run in float64)
  NAME.pndm_timesteps  the N + 1 timesteps it calls the model at
  NAME.euler       x_T (times init_noise_sigma) denoised by
                   EulerDiscreteScheduler.from_config(scheduler), its input scaled by
                   scale_model_input, as StableDiffusionPipeline calls it
  NAME.euler_timesteps  its N (float) timesteps
  NAME.dpm         x_T denoised by DPMSolverMultistepScheduler.from_config(scheduler)
                   (dpmsolver++, order 2, midpoint, final σ 0)
  NAME.dpm_timesteps  its N timesteps
  NAME.dpm_heun    the same with solver_type heun, final_sigmas_type sigma_min and
                   lower_order_final false
  NAME.ddpm        [N, 3] each DDPM step's coefficients of x0 and of x_t in its mean (its
                   step() with zero noise) and its fixed_small variance
  NAME.KEY         for each {"key", "class", "extra", "noise", "eta"} of the case's "runs" (a class of
                   RUNS, configured by the case's scheduler updated with extra, its σ's
                   made from ᾱ's computed in float64, the last 2^-24 with
                   rescale_betas_zero_snr where the class does so (not LCM), Heun's and KDPM2's samples and DEIS's σ's and
                   samples in float64): x_T
                   (times init_noise_sigma) denoised
                   as StableDiffusionPipeline runs a scheduler, the model called on
                   scale_model_input(x, t) at each of its timesteps; the optional noise, a
                   safetensors file whose "noise" [N, 2, 2, 4, 4] holds each step's noise,
                   is what the scheduler's step draws (Euler ancestral, DDPM, LCM, TCD, DPM-Solver's SDE; KDPM2
                   ancestral draws at every call and adds each second call's draw;
                   DPMSolverSDEScheduler's [N, 2, 2, 2, 4, 4] are each step's two Brownian
                   increments, StepBrownian); the optional eta is the step's (TCD's γ)
  NAME.KEY_calls   the timesteps it called the model at, in order
The model (float32, as the C++ test's): out = 0.9 tanh(x) (t + 1) / T + 0.05 sin(3x + t/100),
read as ε or v by the scheduler's prediction_type.
Exit status: 0, or 2 for bad usage.
"""

import json
import math
import sys

import numpy as np
import safetensors.torch  # noqa: F401  (before diffusers)
import torch
from diffusers import (DDIMScheduler, DDPMScheduler, DEISMultistepScheduler,
                       DPMSolverMultistepScheduler,
                       DPMSolverSinglestepScheduler, EulerAncestralDiscreteScheduler, EulerDiscreteScheduler,
                       HeunDiscreteScheduler, KDPM2AncestralDiscreteScheduler,
                       KDPM2DiscreteScheduler, LCMScheduler, LMSDiscreteScheduler,
                       PNDMScheduler, TCDScheduler, UniPCMultistepScheduler)
from diffusers.schedulers import scheduling_ddpm
from step_brownian import StepBrownian, dpm_solver_sde_module

# Its Brownian tree replaced by difftrain's noise (StepBrownian), without torchsde.
DPMSolverSDEScheduler = dpm_solver_sde_module().DPMSolverSDEScheduler
from safetensors.torch import load_file, save_file

# DDPMScheduler.step's noise: zeros, so that a step is its posterior mean.
scheduling_ddpm.randn_tensor = lambda shape, **kwargs: torch.zeros(shape)

SPACINGS = {"leading/0": ("leading", 0), "leading/1": ("leading", 1),
            "trailing/0": ("trailing", 0), "linspace/0": ("linspace", 0)}
DDIM_ONLY = ("set_alpha_to_one",)
# The classes whose __init__ puts 2^-24 in place of a zero ᾱ at the last timestep.
PATCH_LAST_ALPHA = ("EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
                    "DPMSolverMultistepScheduler")
RUNS = {c.__name__: c for c in (EulerDiscreteScheduler, EulerAncestralDiscreteScheduler,
                                HeunDiscreteScheduler, LMSDiscreteScheduler,
                                KDPM2DiscreteScheduler, KDPM2AncestralDiscreteScheduler,
                                DPMSolverMultistepScheduler, DPMSolverSinglestepScheduler,
                                DEISMultistepScheduler, DPMSolverSDEScheduler,
                                UniPCMultistepScheduler, LCMScheduler, TCDScheduler,
                                DDIMScheduler, DDPMScheduler)}


def timesteps(out, T):
    listed = {}
    for name, (spacing, offset) in SPACINGS.items():
        scheduler = DDIMScheduler(num_train_timesteps=T, timestep_spacing=spacing,
                                  steps_offset=offset)
        rows = []
        for n in range(1, T + 1):
            scheduler.set_timesteps(n)
            rows.append([int(t) for t in scheduler.timesteps])
        listed[name] = rows
    with open(out, "w") as f:
        json.dump(listed, f)
    return 0


def alphas_cumprod64(config):
    """The schedule's ᾱ's as diffusers defines them, computed in float64."""
    T = config.get("num_train_timesteps", 1000)
    start, end = config.get("beta_start", 0.0001), config.get("beta_end", 0.02)
    schedule = config.get("beta_schedule", "linear")
    if schedule == "linear":
        betas = np.linspace(start, end, T)
    elif schedule == "scaled_linear":
        betas = np.linspace(start ** 0.5, end ** 0.5, T) ** 2
    else:
        def alpha_bar(t):
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = np.array([min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), 0.999)
                          for i in range(T)])
    betas = torch.from_numpy(np.asarray(betas, dtype=np.float64))
    if config.get("rescale_betas_zero_snr", False):
        betas = scheduling_ddpm.rescale_zero_terminal_snr(betas)
    return torch.cumprod(1.0 - betas, dim=0)


def model(x, t, T):
    return 0.9 * torch.tanh(x) * (t + 1) / T + 0.05 * torch.sin(3 * x + t / 100.0)


def steps(cases_path, out):
    with open(cases_path) as f:
        cases = json.load(f)
    tensors = {}
    for index, case in enumerate(cases):
        name, config, n = case["name"], case["scheduler"], case["steps"]
        T = config.get("num_train_timesteps", 1000)
        ddim = DDIMScheduler(**config)
        ddim.set_timesteps(n)
        x = torch.from_numpy(
            np.random.default_rng(index).standard_normal((2, 2, 4, 4)).astype(np.float32))
        tensors[f"{name}.x_T"] = x.clone()
        tensors[f"{name}.timesteps"] = ddim.timesteps.to(torch.float32)
        abar = []
        for t in ddim.timesteps:
            t = int(t)
            prev = t - T // n
            abar.append([float(ddim.alphas_cumprod[t]),
                         float(ddim.alphas_cumprod[prev]) if prev >= 0
                         else float(ddim.final_alpha_cumprod)])
            x = ddim.step(model(x, float(t), T), t, x, eta=0.0).prev_sample
        tensors[f"{name}.ddim"] = x
        tensors[f"{name}.ddim_abar"] = torch.tensor(abar, dtype=torch.float32)

        # PNDMScheduler has no rescale_betas_zero_snr.
        if not config.get("rescale_betas_zero_snr", False):
            pndm = PNDMScheduler.from_config({**config, "skip_prk_steps": True})
            pndm.set_timesteps(n)
            pndm.alphas_cumprod = alphas_cumprod64(config)
            pndm.final_alpha_cumprod = (torch.tensor(1.0, dtype=torch.float64)
                                        if pndm.config.set_alpha_to_one else pndm.alphas_cumprod[0])
            x = tensors[f"{name}.x_T"].double()
            for t in pndm.timesteps:
                x = pndm.step(model(x, float(t), T), int(t), x).prev_sample
            tensors[f"{name}.pndm"] = x.float()
            tensors[f"{name}.pndm_timesteps"] = pndm.timesteps.to(torch.float32)

        euler = EulerDiscreteScheduler.from_config(config)
        euler.set_timesteps(n)
        x = tensors[f"{name}.x_T"] * euler.init_noise_sigma
        for t in euler.timesteps:
            x = euler.step(model(euler.scale_model_input(x, t), float(t), T), t, x).prev_sample
        tensors[f"{name}.euler"] = x
        tensors[f"{name}.euler_timesteps"] = euler.timesteps.to(torch.float32)

        for key, extra in (("dpm", {}), ("dpm_heun", {"solver_type": "heun",
                                                       "final_sigmas_type": "sigma_min",
                                                       "lower_order_final": False})):
            dpm = DPMSolverMultistepScheduler.from_config({**config, **extra})
            dpm.set_timesteps(n)
            x = tensors[f"{name}.x_T"].clone()
            for t in dpm.timesteps:
                x = dpm.step(model(x, float(t), T), t, x).prev_sample
            tensors[f"{name}.{key}"] = x
            tensors[f"{name}.{key}_timesteps"] = dpm.timesteps.to(torch.float32)

        restore = []
        for run in case.get("runs", []):
            scheduler = RUNS[run["class"]].from_config({**config, **run.get("extra", {})})
            # Its σ's from ᾱ's computed in float64, as PNDM's above: the cosine schedule's fp32
            # ᾱ_999 moves σ_max, and the 7-step Heun sample by 1.8e-3.
            scheduler.alphas_cumprod = alphas_cumprod64(dict(scheduler.config))
            if scheduler.config.get("rescale_betas_zero_snr", False) and \
                    run["class"] in PATCH_LAST_ALPHA:
                scheduler.alphas_cumprod[-1] = 2**-24  # as the class's __init__ does
            scheduler.set_timesteps(n)
            if "noise" in run and run["class"] == "DPMSolverSDEScheduler":
                scheduler.noise_sampler = StepBrownian(load_file(run["noise"])["noise"])
            elif "noise" in run:
                # A stochastic scheduler's step noise, the C++ sampler's: one tensor a step (put
                # back after the run, DDPM's module being the coefficients' below too).
                noise = list(load_file(run["noise"])["noise"].unbind(0))
                drawn = sys.modules[type(scheduler).__module__]
                restore.append((drawn, drawn.randn_tensor))
                if run["class"] == "KDPM2AncestralDiscreteScheduler":
                    # Its step() draws at every call and adds the draw at each second one.
                    noise = [z for step in noise for z in (torch.zeros_like(step), step)]
                sys.modules[type(scheduler).__module__].randn_tensor = \
                    lambda shape, **kwargs: noise.pop(0).reshape(shape)
            x = tensors[f"{name}.x_T"] * scheduler.init_noise_sigma
            if run["class"] in ("HeunDiscreteScheduler", "KDPM2DiscreteScheduler",
                                "KDPM2AncestralDiscreteScheduler"):
                # In float64: its steps' x0 = x − σ ε cancels in fp32 where x is σ_max ≈ 2e4
                # times x_T (the cosine schedule), its second call's slope amplifies it by
                # σ/σ' (fp32: 6.2e-5 off the 7-step cosine sample).
                x = x.double()
            if run["class"] == "DEISMultistepScheduler":
                # Its σ's, and so its coefficients, in float64: each is the difference of two
                # antiderivatives (ind_fn) many times its size, which cancels in fp32 (the
                # 50-step SD sample of order 3 lands 1.0e-4 off diffusers' own float64 run).
                scheduler.sigmas = scheduler.sigmas.double()
                x = x.double()
            calls = []
            for t in scheduler.timesteps:
                calls.append(float(t))
                x_in = scheduler.scale_model_input(x, t)
                x = scheduler.step(model(x_in, float(t), T), t, x,
                                   **({"eta": run["eta"]} if "eta" in run else {})).prev_sample
            tensors[f"{name}.{run['key']}"] = x.float()
            tensors[f"{name}.{run['key']}_calls"] = torch.tensor(calls, dtype=torch.float32)
            for module, draw in restore:
                module.randn_tensor = draw
            restore.clear()

        # DDPM's step, its noise zero and the model's output read as x0: the posterior mean's
        # coefficients are the step of (x0 = 1, x_t = 0) and of (x0 = 0, x_t = 1).
        ddpm_config = {k: v for k, v in config.items() if k not in DDIM_ONLY}
        ddpm_config.update(prediction_type="sample", clip_sample=False)
        ddpm = DDPMScheduler(**ddpm_config)
        ddpm.set_timesteps(n)
        one, zero = torch.ones(1, 1, 1, 1), torch.zeros(1, 1, 1, 1)
        coefficients = []
        for t in ddpm.timesteps:
            t = int(t)
            coefficients.append([float(ddpm.step(one, t, zero).prev_sample),
                                 float(ddpm.step(zero, t, one).prev_sample),
                                 float(ddpm._get_variance(t))])
        tensors[f"{name}.ddpm"] = torch.tensor(coefficients, dtype=torch.float32)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out)
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "timesteps":
        return timesteps(argv[2], int(argv[3]))
    if len(argv) == 4 and argv[1] == "steps":
        return steps(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
