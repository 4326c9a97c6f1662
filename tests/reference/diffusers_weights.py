#!/usr/bin/python3
"""Pretrained weights as diffusers saves them, for `checkpoint.init_from` (and debug-dump's
--init-from):

    PYTHON tests/reference/diffusers_weights.py save DUMP DIR
    PYTHON tests/reference/diffusers_weights.py compare DIR DUMP

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).

save: builds UNet2DConditionModel from the config of DUMP (a `difftrain debug-dump` of a
unet) with PyTorch's initialisation (seed 0) and every tensor then moved off it by a random
amount (so that no tensor is left at zero or one, where a tensor read into the wrong place
would still match), casts it to float16 and writes it with save_pretrained(DIR,
variant="fp16"), as a pipeline's unet/ folder holds fp16 weights:
DIR/diffusion_pytorch_model.fp16.safetensors and DIR/config.json.

compare: every tensor of DIR's model (loaded back by diffusers, from_pretrained(DIR,
variant="fp16")) equals the dump's parameter of the same name exactly (float16 to float32 is
exact), and the dump has no parameter DIR's model lacks. Prints each mismatch.
Exit status: 0 if they all match, 1 if not.
"""

import json
import os
import sys

import safetensors.torch  # noqa: F401  (diffusers 0.27.2 calls it without importing it)
import torch
from diffusers import UNet2DConditionModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

DIFFTRAIN_KEYS = ("name", "text_length", "text_dropout")


def save(dump, out):
    _, metadata = safetensors_np.read(dump)
    config = json.loads(metadata["config"])
    for key in DIFFTRAIN_KEYS:
        config.pop(key, None)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(**config)
    with torch.no_grad():
        for p in unet.parameters():
            p.add_(0.1 * torch.randn_like(p))
    unet.half().save_pretrained(out, variant="fp16")
    print(f"saved {sum(p.numel() for p in unet.parameters())} parameters to {out}")
    return 0


def compare(folder, dump):
    tensors, _ = safetensors_np.read(dump)
    unet = UNet2DConditionModel.from_pretrained(folder, variant="fp16", torch_dtype=torch.float16)
    state = unet.state_dict()
    failures = []
    for name, value in state.items():
        if name not in tensors:
            failures.append(f"{name}: not in the dump")
            continue
        expected = value.float().numpy()
        if tensors[name].shape != expected.shape or (tensors[name] != expected).any():
            failures.append(f"{name}: differs")
    params = {n for n in tensors if not n.startswith(("input.", "grad.")) and n not in ("output", "loss")}
    failures += [f"{n}: in the dump, not in the model" for n in sorted(params - set(state))]
    for f in failures:
        print(f)
    print(f"{len(state)} tensors compared, {len(failures)} mismatches")
    return 1 if failures else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "save":
        return save(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "compare":
        return compare(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
