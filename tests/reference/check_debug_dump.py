#!/usr/bin/python3
"""Checks a `difftrain debug-dump` file against the float64 PyTorch reference DiT or Latte.

    /usr/bin/python3 tests/reference/check_debug_dump.py FILE [--tol 1e-5]

The dump holds one training step: the parameters, the inputs (x0, noise, t, y, x_t), the
model output, the MSE loss of its prediction (epsilon, or v = sqrt(abar) noise -
sqrt(1 - abar) x0 with "prediction" v) and every parameter's gradient. The checker rebuilds the
model of the dump's family (metadata "family": dit, the default, or latte) in float64 from
the dump's config and parameters, recomputes x_t with its own beta schedule (linear,
scaled_linear or cosine, with zero_terminal_snr rescaled as Lin et al.'s Algorithm 1), runs
forward and backward on the dump's x_t, t and y, and compares each tensor.

Error measure: ||a - b|| / ||b|| (L2 norms, b the float64 reference). Where ||b|| is
exactly 0, a relative error means nothing, and the absolute ||a - b|| is used instead,
against the same tol. This happens for the gradients of a DiT-initialised model (its
zero-initialised adaLN and final Linears block every gradient upstream of them), where a
correct implementation also yields exact zeros.

Exit status: 0 if every tensor is within tol, 1 if any is not, 2 if the file is malformed
or lacks a tensor.
"""

import argparse
import dataclasses
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dit_torch  # noqa: E402
import latte_torch  # noqa: E402
import safetensors_np  # noqa: E402

FORMAT = "difftrain-debug-dump"
VERSION = "1"
DIFFUSION_KEYS = {"schedule", "steps", "beta_start", "beta_end"}


@dataclasses.dataclass(frozen=True)
class Family:
    config: type
    model: type
    loss: object
    video: bool


FAMILIES = {
    "dit": Family(dit_torch.DiTConfig, dit_torch.DiT, dit_torch.epsilon_mse_loss, False),
    "latte": Family(latte_torch.LatteConfig, latte_torch.Latte, latte_torch.epsilon_mse_loss, True),
}


class MalformedDump(Exception):
    """The dump cannot be checked: not a dump, or a tensor is missing or misshapen."""


def scaled_linear_betas(steps, beta_start, beta_end):
    """Stable Diffusion's betas: evenly spaced in sqrt(beta), squared."""
    return np.linspace(math.sqrt(beta_start), math.sqrt(beta_end), steps, dtype=np.float64) ** 2


def cosine_betas(steps, beta_start, beta_end):
    """Nichol & Dhariwal's cosine schedule (DiT's "squaredcos_cap_v2"): 1 - abar((i+1)/T) /
    abar(i/T), abar(s) = cos((s + 0.008)/1.008 * pi/2)^2, each capped at 0.999."""
    abar = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    return np.array([min(1 - abar((i + 1) / steps) / abar(i / steps), 0.999)
                     for i in range(steps)], dtype=np.float64)


SCHEDULES = {"linear": dit_torch.linear_beta_schedule, "scaled_linear": scaled_linear_betas,
             "cosine": cosine_betas}


def zero_terminal_snr(betas):
    """Lin et al.'s Algorithm 1: sqrt(abar) shifted to 0 at the last step and scaled to keep
    the first, in float64."""
    root = np.sqrt(np.cumprod(1.0 - betas))
    first, last = root[0], root[-1]
    abar = ((root - last) * first / (first - last)) ** 2
    return 1.0 - np.concatenate([abar[:1], abar[1:] / abar[:-1]])


def schedule(diffusion):
    """The dump's betas, float64."""
    betas = SCHEDULES[diffusion["schedule"]](diffusion["steps"], diffusion["beta_start"],
                                             diffusion["beta_end"])
    return zero_terminal_snr(betas) if diffusion.get("zero_terminal_snr", False) else betas


def parse_metadata(metadata):
    """Returns (Family, its config, diffusion dict) from the header metadata."""
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise MalformedDump(f"metadata format/version is {metadata.get('format')!r}/"
                            f"{metadata.get('version')!r}, expected {FORMAT!r}/{VERSION!r}")
    family = FAMILIES.get(metadata.get("family", "dit"))
    if family is None:
        raise MalformedDump(f"metadata family {metadata.get('family')!r}: known are {sorted(FAMILIES)}")
    config_fields = dataclasses.fields(family.config)
    config = _json_object(metadata, "config", {f.name for f in config_fields}, optional={"name"})
    config.pop("name", None)  # descriptive only ("DiT-S/2" or "custom")
    diffusion = _json_object(metadata, "diffusion", DIFFUSION_KEYS,
                             optional={"loss_weighting", "min_snr_gamma", "prediction",
                                       "frame_noise_correlation", "zero_terminal_snr",
                                       "noise_offset", "input_perturbation"})
    if diffusion["schedule"] not in SCHEDULES:
        raise MalformedDump(f"diffusion schedule {diffusion['schedule']!r}: known are "
                            f"{sorted(SCHEDULES)}")
    if diffusion.get("prediction", "epsilon") not in ("epsilon", "v"):
        raise MalformedDump(f"prediction {diffusion['prediction']!r}: known are epsilon and v")
    if diffusion.get("loss_weighting", "uniform") != "uniform":
        raise MalformedDump(f"loss weighting {diffusion['loss_weighting']!r}: only 'uniform' is known "
                            "(check_vb_loss.py checks the weighted loss)")
    for field in config_fields:
        value = config[field.name]
        allowed = (int, float) if field.type is float else field.type
        # bool is an int in Python; neither may stand for the other here.
        if isinstance(value, bool) != (field.type is bool) or not isinstance(value, allowed):
            raise MalformedDump(f"config {field.name}={value!r} is not a {field.type.__name__}")
    cfg = family.config(**config)
    if cfg.input_size % cfg.patch_size or cfg.hidden_size % cfg.num_heads or cfg.hidden_size % 4:
        raise MalformedDump(f"inconsistent config {config}: input_size must be a multiple of "
                            "patch_size, hidden_size of num_heads and of 4 (2-D sin-cos)")
    if family.video and (cfg.depth % 2 or cfg.num_frames < 1):
        raise MalformedDump(f"inconsistent config {config}: Latte needs an even depth and frames")
    return family, cfg, diffusion


def _json_object(metadata, key, keys, optional=frozenset()):
    if key not in metadata:
        raise MalformedDump(f"metadata has no {key!r}")
    try:
        value = json.loads(metadata[key])
    except json.JSONDecodeError as e:
        raise MalformedDump(f"metadata {key!r} is not JSON: {e}") from None
    if not isinstance(value, dict) or not keys <= set(value) <= keys | optional:
        raise MalformedDump(f"metadata {key!r} must have exactly the keys {sorted(keys)}, "
                            f"has {sorted(value) if isinstance(value, dict) else value!r}")
    return value


def expected_shapes(model, batch, video, perturbed=False):
    """name -> (shape, kind) for every tensor a dump of this model must hold; kind is
    "float" or "int". A video's samples are [F, C, H, W]. A dump with input perturbation
    holds its term, input.perturbation, too."""
    cfg = model.cfg
    frames = (cfg.num_frames,) if video else ()
    image = (batch, *frames, cfg.in_channels, cfg.input_size, cfg.input_size)
    shapes = {name: (tuple(p.shape), "float") for name, p in model.named_parameters()}
    shapes.update({
        "input.x0": (image, "float"), "input.noise": (image, "float"),
        "input.t": ((batch,), "int"),
        "input.x_t": (image, "float"),
        **({"input.perturbation": (image, "float")} if perturbed else {}),
        "output": ((batch, *frames, cfg.out_channels, cfg.input_size, cfg.input_size), "float"),
        "loss": ((1,), "float"),
    })
    if cfg.num_classes > 0:  # an unconditional model's dump has no labels
        shapes["input.y"] = ((batch,), "int")
    shapes.update({f"grad.{name}": (tuple(p.shape), "float")
                   for name, p in model.named_parameters() if p.requires_grad})
    return shapes


def validate_tensors(tensors, shapes):
    missing = [name for name in shapes if name not in tensors]
    unexpected = [name for name in tensors if name not in shapes]
    if missing or unexpected:
        raise MalformedDump(f"missing tensors {missing}, unexpected tensors {unexpected}")
    for name, (shape, kind) in shapes.items():
        array = tensors[name]
        numeric = np.floating if kind == "float" else np.integer
        if tuple(array.shape) != shape or not np.issubdtype(array.dtype, numeric):
            raise MalformedDump(f"tensor {name!r} is {array.dtype}{list(array.shape)}, "
                                f"expected {kind}{list(shape)}")


def error(actual, expected):
    """(error, "rel" | "abs"): the relative L2 error, or the absolute one where the
    reference is exactly zero. Non-finite values give an infinite error."""
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    if not torch.isfinite(actual).all():
        return math.inf, "rel"
    diff = torch.linalg.vector_norm(actual - expected).item()
    norm = torch.linalg.vector_norm(expected).item()
    return (diff / norm, "rel") if norm > 0 else (diff, "abs")


def labels(tensors):
    """The dump's labels; zeros (never read) for an unconditional model, whose dump has none."""
    if "input.y" in tensors:
        return tensors["input.y"]
    return np.zeros(tensors["input.t"].shape, dtype=np.int64)


def reference_step(family, model, tensors, betas, prediction):
    """Runs forward and backward on the dump's inputs; returns name -> float64 tensor for
    output, loss and every grad.*."""
    as64 = lambda name: torch.from_numpy(tensors[name]).to(torch.float64)  # noqa: E731
    t = torch.from_numpy(tensors["input.t"]).long()
    output = model(as64("input.x_t"), t, torch.from_numpy(labels(tensors)).long())
    target = as64("input.noise")
    if prediction == "v":
        # v = sqrt(abar) noise - sqrt(1 - abar) x0, per sample.
        abar = torch.from_numpy(np.cumprod(1.0 - betas))[t].reshape((-1,) + (1,) * (target.dim() - 1))
        target = abar.sqrt() * target - (1 - abar).sqrt() * as64("input.x0")
    loss = family.loss(output, target)
    loss.backward()
    result = {"output": output.detach(), "loss": loss.detach().reshape(1)}
    result.update({f"grad.{name}": p.grad for name, p in model.named_parameters() if p.requires_grad})
    return result


def check(path, tol):
    """Prints one line per tensor and a summary; returns True iff every error <= tol.
    Raises MalformedDump or safetensors_np.SafetensorsError for a bad file."""
    tensors, metadata = safetensors_np.read(path)
    family, cfg, diffusion = parse_metadata(metadata)
    if "input.t" not in tensors:
        raise MalformedDump("missing tensor 'input.t'")
    batch = tensors["input.t"].shape[0]

    model = family.model(cfg, dtype=torch.float64)
    perturbed = diffusion.get("input_perturbation", 0) > 0
    validate_tensors(tensors, expected_shapes(model, batch, family.video, perturbed))
    t, y = tensors["input.t"], labels(tensors)
    if t.min() < 0 or t.max() >= diffusion["steps"]:
        raise MalformedDump(f"input.t {t.tolist()} outside [0, {diffusion['steps']})")
    num_rows = model.y_embedder.embedding_table.num_embeddings if cfg.num_classes > 0 else 1
    if y.min() < 0 or y.max() >= num_rows:
        raise MalformedDump(f"input.y {y.tolist()} outside [0, {num_rows})")
    model.load_state_dict({name: torch.from_numpy(tensors[name]) for name in model.state_dict()})

    # Every comparison, as (name, value in the dump, float64 reference value).
    betas = schedule(diffusion)
    # diffusers' input perturbation: x_t of the noise plus the perturbation; the target the noise.
    mixed = torch.from_numpy(tensors["input.noise"])
    if perturbed:
        mixed = mixed + torch.from_numpy(tensors["input.perturbation"])
    x_t = dit_torch.q_sample(torch.from_numpy(tensors["input.x0"]), mixed, torch.from_numpy(t).long(), betas)
    grid_size = cfg.input_size // cfg.patch_size
    pos_embed = dit_torch.get_2d_sincos_pos_embed(cfg.hidden_size, grid_size)[None]
    comparisons = [("input.x_t", tensors["input.x_t"], x_t), ("pos_embed", tensors["pos_embed"], pos_embed)]
    if family.video:
        temp_embed = latte_torch.get_1d_sincos_temp_embed(cfg.hidden_size, cfg.num_frames)[None]
        comparisons.append(("temp_embed", tensors["temp_embed"], temp_embed))
    comparisons += [(name, tensors[name], value)
                    for name, value in reference_step(family, model, tensors, betas,
                                                      diffusion.get("prediction", "epsilon")).items()]

    print(f"{path}: seed {metadata.get('seed', '?')}, batch {batch}, config {metadata['config']}")
    width = max(len(name) for name, _, _ in comparisons)
    failures = []
    worst = ("", -1.0, "rel")
    for name, actual, expected in comparisons:
        err, kind = error(actual, expected)
        ok = err <= tol
        print(f"{name:<{width}}  {kind} {err:.3e}  {'OK' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
        if err > worst[1]:
            worst = (name, err, kind)
    verdict = "all OK" if not failures else f"{len(failures)} FAILED ({', '.join(failures)})"
    print(f"summary: {len(comparisons)} tensors, tol {tol:g}: {verdict}; "
          f"worst {worst[0]} ({worst[2]} {worst[1]:.3e})")
    return not failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the debug-dump .safetensors file")
    parser.add_argument("--tol", type=float, default=1e-5,
                        help="largest relative L2 error (absolute where the reference is 0)")
    args = parser.parse_args(argv)
    try:
        return 0 if check(args.file, args.tol) else 1
    except (MalformedDump, safetensors_np.SafetensorsError, OSError) as e:
        print(f"error: cannot check {args.file}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
