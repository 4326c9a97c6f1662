#!/usr/bin/python3
"""Checks difftrain's training loss (DiffusionLoss) against the float64 PyTorch port of DiT's
diffusion (diffusion_torch.py).

    /usr/bin/python3 tests/reference/check_vb_loss.py FILE [--tol 1e-5]

FILE is a safetensors file holding one call of the loss:

    output  F32 [B, out_channels, H, W]   the model output (eps, then v with learn_sigma)
    x0      F32 [B, C, H, W]
    x_t     F32 [B, C, H, W]
    noise   F32 [B, C, H, W]
    t       I64 [B]
    loss    F32 [1]                       the loss difftrain computed
    dout    F32 [B, out_channels, H, W]   difftrain's grad_scale * d loss / d output

and the metadata `format` = "difftrain-loss-check", `diffusion` (JSON: schedule (linear or
cosine), steps, beta_start, beta_end, loss_weighting (uniform or min_snr), min_snr_gamma),
`learn_sigma` ("true"/"false") and `grad_scale` (decimal).

The checker recomputes the loss with autograd from the file's inputs and compares loss and
dout by relative L2 error ||a - b|| / ||b||. Exit status: 0 if both are within tol, 1 if
not, 2 if the file is malformed.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffusion_torch  # noqa: E402
import safetensors_np  # noqa: E402

FORMAT = "difftrain-loss-check"


class Malformed(Exception):
    """The file cannot be checked."""


def parse(tensors, metadata):
    if metadata.get("format") != FORMAT:
        raise Malformed(f"metadata format is {metadata.get('format')!r}, expected {FORMAT!r}")
    try:
        schedule = json.loads(metadata["diffusion"])
        learn_sigma = {"true": True, "false": False}[metadata["learn_sigma"]]
        grad_scale = float(metadata["grad_scale"])
    except (KeyError, ValueError) as e:
        raise Malformed(f"bad or missing metadata: {e}") from None
    if schedule.get("schedule") not in ("linear", "cosine"):
        raise Malformed(f"diffusion schedule {schedule.get('schedule')!r}: expected linear or cosine")
    if schedule.get("loss_weighting", "uniform") not in ("uniform", "min_snr"):
        raise Malformed(f"loss weighting {schedule.get('loss_weighting')!r}: expected uniform or min_snr")
    missing = [n for n in ("output", "x0", "x_t", "noise", "t", "loss", "dout") if n not in tensors]
    if missing:
        raise Malformed(f"missing tensors {missing}")
    B, C = tensors["x0"].shape[:2]
    out_channels = 2 * C if learn_sigma else C
    image = tensors["x0"].shape
    expected = {"x_t": image, "noise": image, "t": (B,), "loss": (1,),
                "output": (B, out_channels) + image[2:], "dout": (B, out_channels) + image[2:]}
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise Malformed(f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    t = tensors["t"]
    if t.min() < 0 or t.max() >= schedule["steps"]:
        raise Malformed(f"t {t.tolist()} outside [0, {schedule['steps']})")
    if schedule["schedule"] == "cosine":
        betas = diffusion_torch.cosine_betas(schedule["steps"])
    else:
        betas = diffusion_torch.linear_betas(schedule["steps"], schedule["beta_start"], schedule["beta_end"])
    diffusion = diffusion_torch.Diffusion(betas)
    weights = None
    if schedule.get("loss_weighting", "uniform") == "min_snr":
        weights = diffusion_torch.min_snr_weights(diffusion, torch.from_numpy(t).long(),
                                                  schedule["min_snr_gamma"])
    return diffusion, weights, learn_sigma, grad_scale


def relative_error(actual, expected):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    if not torch.isfinite(actual).all():
        return float("inf")
    norm = torch.linalg.vector_norm(expected).item()
    diff = torch.linalg.vector_norm(actual - expected).item()
    return diff / norm if norm > 0 else diff


def check(path, tol):
    tensors, metadata = safetensors_np.read(path)
    diffusion, weights, learn_sigma, grad_scale = parse(tensors, metadata)
    as64 = lambda name: torch.from_numpy(tensors[name]).to(torch.float64)  # noqa: E731
    output = as64("output").requires_grad_(True)
    loss = diffusion_torch.training_loss(diffusion, output, as64("x0"), as64("x_t"), as64("noise"),
                                         torch.from_numpy(tensors["t"]).long(), learn_sigma, weights)
    loss.backward()
    results = [("loss", relative_error(tensors["loss"], loss.detach().reshape(1))),
               ("dout", relative_error(tensors["dout"], grad_scale * output.grad))]
    print(f"{path}: batch {tensors['t'].shape[0]}, t {tensors['t'].tolist()}, learn_sigma {learn_sigma}, "
          f"schedule {json.loads(metadata['diffusion'])['schedule']}, weighted {weights is not None}, "
          f"loss {tensors['loss'][0]:.6f} (reference {loss.item():.6f})")
    ok = True
    for name, err in results:
        print(f"{name}  rel {err:.3e}  {'OK' if err <= tol else 'FAIL'}")
        ok &= err <= tol
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--tol", type=float, default=1e-5, help="largest relative L2 error")
    args = parser.parse_args(argv)
    try:
        return 0 if check(args.file, args.tol) else 1
    except (Malformed, safetensors_np.SafetensorsError, OSError) as e:
        print(f"error: cannot check {args.file}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
