#!/usr/bin/python3
"""Checks a `difftrain debug-dump` of a UNet against diffusers' UNet2DConditionModel.

    PYTHON tests/reference/check_unet_dump.py FILE [--tol 3e-5] [--tol-all 2e-6]

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2 on
Debian's torch). The dump holds one training step: the parameters under diffusers' names,
the inputs (x0, noise, t, the text embedding after dropout, x_t), the output, the MSE loss
and every parameter's gradient; its "config" metadata holds UNet2DConditionModel's keys plus
difftrain's own (name, text_length, text_dropout, requires_aesthetics_score). The checker builds
UNet2DConditionModel(**config) in float64, loads the parameters with
load_state_dict(strict=True), recomputes x_t from the diffusion metadata (its schedule
rescaled by diffusers' rescale_zero_terminal_snr where zero_terminal_snr), runs forward and
backward on the dump's x_t, t and text, and compares each tensor.

A dump of LoRA training (`debug-dump --lora-rank R`, "lora" metadata: rank, alpha, targets)
holds the frozen weights under their names, the adapters as `lora.M.lora_A.weight` and
`lora.M.lora_B.weight`, and only the adapters' gradients (`grad.lora.…`). The checker adds each
adapter to its module as peft's LoRA layers compute it, beside the frozen module:
module(x) + alpha/rank · B(A(x)) (for a Conv2d, A a convolution of the module's kernel, stride
and padding, B a 1×1 one), with the frozen weights not requiring gradients, and compares the
adapters' gradients; the dump fuses the adapters into the weights instead (model/cpu/low_rank.h),
so the two are different computations of the same gradient. A DoRA dump (`--lora-use-dora`,
"use_dora" in the metadata; its magnitudes as `lora.M.lora_magnitude_vector`) or of rsLoRA
(`--lora-use-rslora`, "use_rslora": the scale alpha/sqrt(rank)) is checked against peft's own
layers instead (peft 0.10.0, in tests/reference/peft_env.sh's interpreter): the adapters are
injected with the dump's use_dora and use_rslora, given its A, B (and magnitudes), and their
gradients compared.

Error measure: ||a - b|| / ||b|| (L2 norms, b the float64 reference). Where the reference
gradient vanishes mathematically (below 1e-9 of the largest), the absolute error relative to
the largest gradient norm is used. Each tensor must be within --tol, and all gradients
together within --tol-all.

The dump is fp32, and small bias and norm gradients (sums whose terms mostly cancel) lose
the most to its rounding: on ill-conditioned tiny models (GroupNorms of one channel per
group) up to a few 1e-5, in diffusers' own float32 run as in difftrain's. How much depends on
the BLAS kernels too, which OpenBLAS picks by the CPU: over the tests' five configs, the worst
tensor was 1.4e-6 to 1.04e-5 with the Cooperlake, SkylakeX, Haswell, Sandybridge and Prescott
kernels, all gradients together 5.7e-7 to 9.6e-7. Hence 3e-5 per tensor and 2e-6 for all
gradients together; a wrong layer is off by 1e-3 or more.
Exit status: 0 if every tensor passes, 1 if any does not, 2 if the file is malformed.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import diffusers.models.embeddings
from diffusers import UNet2DConditionModel
from diffusers.schedulers import scheduling_ddpm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

DIFFTRAIN_KEYS = ("name", "text_length", "text_dropout", "requires_aesthetics_score")


class MalformedDump(Exception):
    pass


def timestep_embedding_float64(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1,
                               scale=1, max_period=10000):
    """diffusers' get_timestep_embedding in float64. diffusers computes the sinusoidal
    features in float32 even in a float64 model (timesteps.float()), which at t near 1000
    leaves phase errors of about 3e-5; the reference must be exact, so the same formula runs
    here in float64, with the order ([cos, sin] by flip_sin_to_cos) and shift the model's
    config gives."""
    half = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float64) / (half - downscale_freq_shift)
    emb = scale * timesteps[:, None].to(torch.float64) * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return emb


diffusers.models.embeddings.get_timestep_embedding = timestep_embedding_float64


def betas(diffusion):
    """The schedule's β's in float64; with zero_terminal_snr rescaled by diffusers' own
    rescale_zero_terminal_snr (rescale_betas_zero_snr)."""
    steps, lo, hi = diffusion["steps"], diffusion["beta_start"], diffusion["beta_end"]
    if diffusion["schedule"] == "linear":
        b = np.linspace(lo, hi, steps, dtype=np.float64)
    elif diffusion["schedule"] == "scaled_linear":
        b = np.linspace(lo ** 0.5, hi ** 0.5, steps, dtype=np.float64) ** 2
    else:
        raise MalformedDump(f"schedule {diffusion['schedule']!r}: only linear and scaled_linear")
    if diffusion.get("zero_terminal_snr", False):
        b = scheduling_ddpm.rescale_zero_terminal_snr(torch.from_numpy(b)).numpy()
    return b


def error(actual, expected, scale=0.0):
    """(error, kind): relative L2 error; where the reference is below 1e-9 of `scale` (a
    gradient that vanishes mathematically, such as the bias before a GroupNorm whose groups
    hold one channel each, which only rounding makes non-zero) the absolute error relative to
    `scale` ("vanishing")."""
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    if actual.shape != expected.shape:
        return math.inf, "shape"
    if not torch.isfinite(actual).all():
        return math.inf, "rel"
    diff = torch.linalg.vector_norm(actual - expected).item()
    norm = torch.linalg.vector_norm(expected).item()
    if norm <= 1e-9 * scale:
        return diff / scale, "vanishing"
    return (diff / norm, "rel") if norm > 0 else (diff, "abs")


def check(path, tol, tol_all):
    tensors, metadata = safetensors_np.read(path)
    if metadata.get("format") != "difftrain-debug-dump" or metadata.get("family") != "unet":
        raise MalformedDump("not a debug dump of a unet")
    config = json.loads(metadata["config"])
    for key in DIFFTRAIN_KEYS:
        config.pop(key, None)
    diffusion = json.loads(metadata["diffusion"])
    prediction = diffusion.get("prediction", "epsilon")
    t = torch.from_numpy(tensors["input.t"]).long()
    abar = torch.from_numpy(np.cumprod(1 - betas(diffusion)))[t].reshape(-1, 1, 1, 1)
    lora = json.loads(metadata["lora"]) if "lora" in metadata else None
    reference = reference_step(config, tensors, t, abar, prediction, lora=lora)
    x0, noise = (torch.from_numpy(tensors[n]).to(torch.float64) for n in ("input.x0", "input.noise"))
    if "input.perturbation" in tensors:  # diffusers' input perturbation: x_t of noise + it
        noise = noise + torch.from_numpy(tensors["input.perturbation"]).to(torch.float64)
    reference["input.x_t"] = abar.sqrt() * x0 + (1 - abar).sqrt() * noise

    print(f"{path}: batch {t.shape[0]}, {prediction}-prediction, config {metadata['config']}")
    # The scale of the gradients, for those that vanish: the largest gradient norm.
    scale = max(torch.linalg.vector_norm(v).item() for n, v in reference.items() if n.startswith("grad."))
    failures, worst = [], ("", -1.0)
    for name, expected in reference.items():
        if name not in tensors:
            raise MalformedDump(f"missing tensor {name}")
        err, kind = error(tensors[name], expected, scale if name.startswith("grad.") else 0.0)
        if not err <= tol:
            failures.append(name)
            print(f"{name}  {kind} {err:.3e}  FAIL")
        if err > worst[1]:
            worst = (name, err)
    grads = [n for n in reference if n.startswith("grad.")]
    flat = lambda d: torch.cat([torch.as_tensor(d[n], dtype=torch.float64).flatten() for n in grads])  # noqa: E731
    all_err, _ = error(flat(tensors), flat(reference))
    if not all_err <= tol_all:
        failures.append("all gradients together")
        print(f"all gradients together  rel {all_err:.3e}  FAIL (tol {tol_all:g})")
    verdict = "all OK" if not failures else f"{len(failures)} FAILED"
    print(f"summary: {len(reference)} tensors, tol {tol:g} each, {tol_all:g} all gradients: {verdict}; worst {worst[0]} ({worst[1]:.3e}); all gradients together {all_err:.3e}")
    return not failures


def add_lora(model, tensors, lora, tensor):
    """peft's LoRA layers beside the frozen modules: each adapted module's output plus
    alpha/rank · B(A(x)). Returns the adapters, by their dump names."""
    scale = (lora["alpha"] or lora["rank"]) / lora["rank"]
    adapters = {}
    for name in tensors:
        if not (name.startswith("lora.") and name.endswith(".lora_A.weight")):
            continue
        module_name = name[len("lora."):-len(".lora_A.weight")]
        module = model.get_submodule(module_name)
        a = torch.nn.Parameter(tensor(name))
        b = torch.nn.Parameter(tensor(f"lora.{module_name}.lora_B.weight"))
        adapters[name], adapters[f"lora.{module_name}.lora_B.weight"] = a, b

        def hook(mod, inputs, output, a=a, b=b):
            x = inputs[0]
            if isinstance(mod, torch.nn.Conv2d):
                down = torch.nn.functional.conv2d(x, a, stride=mod.stride, padding=mod.padding)
                return output + scale * torch.nn.functional.conv2d(down, b)
            return output + scale * torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)

        module.register_forward_hook(hook)
    if not adapters:
        raise MalformedDump("a LoRA dump without lora.*.lora_A.weight tensors")
    return adapters


def add_peft(model, tensors, lora, tensor, dtype):
    """peft's own LoRA layers (LoraConfig with the dump's use_dora and use_rslora) on the dump's
    target modules, holding its A, B (and DoRA's magnitudes). Returns their parameters, by the
    dump's names."""
    try:
        import peft
    except ImportError:
        raise MalformedDump("a DoRA or rsLoRA dump is checked with peft: run this with the "
                            "python tests/reference/peft_env.sh prints")
    dora = bool(lora.get("use_dora"))
    suffix = ".lora_A.weight"
    modules = [n[len("lora."):-len(suffix)] for n in tensors
               if n.startswith("lora.") and n.endswith(suffix)]
    if not modules:
        raise MalformedDump("a LoRA dump without lora.*.lora_A.weight tensors")
    if dora and not any(n.endswith(".lora_magnitude_vector") for n in tensors):
        raise MalformedDump("a DoRA dump without lora.*.lora_magnitude_vector tensors")
    config = peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"] or lora["rank"],
                             target_modules=modules, use_dora=dora,
                             use_rslora=bool(lora.get("use_rslora")))
    peft.inject_adapter_in_model(config, model)
    model.to(dtype)
    adapters = {}
    for name in modules:
        layer = model.get_submodule(name)
        parts = {".lora_A.weight": layer.lora_A["default"].weight,
                 ".lora_B.weight": layer.lora_B["default"].weight}
        if dora:
            parts[".lora_magnitude_vector"] = layer.lora_magnitude_vector["default"]
        for part, parameter in parts.items():
            value = tensor(f"lora.{name}{part}")
            if value.shape != parameter.shape:
                raise MalformedDump(f"lora.{name}{part}: shape {tuple(value.shape)}, peft's "
                                    f"{tuple(parameter.shape)}")
            with torch.no_grad():
                parameter.copy_(value)
            adapters[f"lora.{name}{part}"] = parameter
    return adapters


def reference_step(config, tensors, t, abar, prediction, dtype=torch.float64, lora=None):
    """Output, loss and every gradient of diffusers' UNet on the dump's inputs, in `dtype`; with
    `lora`, of its adapters only."""
    model = UNet2DConditionModel(**config).to(dtype)
    # Copies: tensors of the dump's dtype would alias its read-only buffers.
    tensor = lambda name: torch.tensor(tensors[name], dtype=dtype)  # noqa: E731
    state = {name: tensor(name) for name in model.state_dict() if name in tensors}
    model.load_state_dict(state, strict=True)
    if lora is not None:
        model.requires_grad_(False)
        if lora.get("use_dora") or lora.get("use_rslora"):
            adapters = add_peft(model, tensors, lora, tensor, dtype)
        else:
            adapters = add_lora(model, tensors, lora, tensor)
    # SDXL's micro-conditioning (addition_embed_type text_time): the pooled text and time ids.
    added = None
    if "input.pooled_text" in tensors:
        added = {"text_embeds": tensor("input.pooled_text"), "time_ids": tensor("input.time_ids")}
    output = model(tensor("input.x_t"), t, encoder_hidden_states=tensor("input.context"),
                   added_cond_kwargs=added).sample
    x0, noise, a = tensor("input.x0"), tensor("input.noise"), abar.to(dtype)
    target = noise if prediction == "epsilon" else a.sqrt() * noise - (1 - a).sqrt() * x0
    loss = ((output - target) ** 2).mean()
    loss.backward()
    result = {"output": output.detach().double(), "loss": loss.detach().double().reshape(1)}
    if lora is not None:
        result.update({f"grad.{name}": p.grad.double() for name, p in adapters.items()})
    else:
        result.update({f"grad.{name}": p.grad.double() for name, p in model.named_parameters()})
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--tol", type=float, default=3e-5, help="each tensor")
    parser.add_argument("--tol-all", type=float, default=2e-6, help="all gradients together")
    args = parser.parse_args(argv)
    try:
        return 0 if check(args.file, args.tol, args.tol_all) else 1
    except (MalformedDump, safetensors_np.SafetensorsError, OSError, KeyError) as e:
        print(f"error: cannot check {args.file}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
