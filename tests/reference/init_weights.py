#!/usr/bin/python3
"""Pretrained weights as PyTorch and diffusers write them, for `checkpoint.init_from` (and
`difftrain debug-dump --init-from`), and the check that difftrain read them:

    /usr/bin/python3 tests/reference/init_weights.py save-dit DUMP FILE
    /usr/bin/python3 tests/reference/init_weights.py compare-dit FILE DUMP
    PYTHON tests/reference/init_weights.py save-diffusers DUMP DIR
    PYTHON tests/reference/init_weights.py compare-diffusers DIR DUMP
    PYTHON tests/reference/init_weights.py save-scheduler DIR

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2); the DiT
commands need Debian's torch alone. DUMP is a `difftrain debug-dump`, whose config says the
model. Each saved model starts from its own initialisation (seed 0), then every trainable
tensor moves by 0.1 · N(0, 1): DiT zero-initialises its adaLN and final layers, where a tensor
read into the wrong place would still match.

save-dit: the reference DiT or Latte (dit_torch, latte_torch); its whole state_dict (the fixed
pos_embed included) to FILE in float32, as DiT's released weights look saved as safetensors.
save-diffusers: UNet2DConditionModel, cast to float16 and written by save_pretrained(DIR,
variant="fp16"), as a pipeline's unet/ folder holds it.
compare-*: every tensor of the saved model equals the dump's tensor of the same name exactly
(float16 to float32 is exact); compare-diffusers (of the fp16 variant where DIR has one, else
of the float32 weights) also fails a dump parameter the model lacks.
save-scheduler: a DDIMScheduler as Stable Diffusion 2's pipelines configure it (scaled_linear
from 0.00085 to 0.012, v_prediction, steps_offset 1), written by save_pretrained(DIR), as a
pipeline's scheduler/ folder holds it.
Exit status: 0 if they all match, 1 if not, 2 for bad usage.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

DIFFTRAIN_KEYS = ("name", "text_length", "text_dropout")


def perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_dit(dump, out):
    import check_debug_dump

    _, metadata = safetensors_np.read(dump)
    family, cfg, _ = check_debug_dump.parse_metadata(metadata)
    torch.manual_seed(0)
    model = perturbed(family.model(cfg, dtype=torch.float32))
    state = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    safetensors_np.write(out, state)
    print(f"saved {len(state)} tensors to {out}")
    return 0


def unet_class():
    """diffusers' UNet2DConditionModel, imported only by the diffusers commands."""
    import safetensors.torch  # noqa: F401  (diffusers 0.27.2 calls it without importing it)
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel


def save_diffusers(dump, out):
    _, metadata = safetensors_np.read(dump)
    config = json.loads(metadata["config"])
    for key in DIFFTRAIN_KEYS:
        config.pop(key, None)
    torch.manual_seed(0)
    unet = perturbed(unet_class()(**config))
    unet.half().save_pretrained(out, variant="fp16")
    print(f"saved {sum(p.numel() for p in unet.parameters())} parameters to {out}")
    return 0


def save_scheduler(out):
    import safetensors.torch  # noqa: F401
    from diffusers import DDIMScheduler

    DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                  clip_sample=False, set_alpha_to_one=False, steps_offset=1,
                  prediction_type="v_prediction").save_pretrained(out)
    print(f"saved the scheduler to {out}")
    return 0


def report(saved, dump, extra=()):
    """saved: name -> float32 array. Prints the mismatches; returns the exit status."""
    tensors, _ = safetensors_np.read(dump)
    failures = [f"{name}: differs or is missing in the dump" for name, value in saved.items()
                if name not in tensors or tensors[name].shape != value.shape or (tensors[name] != value).any()]
    failures += [f"{name}: in the dump, not in the model" for name in extra]
    for f in failures:
        print(f)
    print(f"{len(saved)} tensors compared, {len(failures)} mismatches")
    return 1 if failures else 0


def compare_dit(path, dump):
    return report(safetensors_np.read(path)[0], dump)


def compare_diffusers(folder, dump):
    fp16 = os.path.exists(os.path.join(folder, "diffusion_pytorch_model.fp16.safetensors"))
    unet = unet_class().from_pretrained(folder, variant="fp16" if fp16 else None,
                                        torch_dtype=torch.float16 if fp16 else torch.float32)
    saved = {name: value.float().numpy() for name, value in unet.state_dict().items()}
    tensors, _ = safetensors_np.read(dump)
    params = {n for n in tensors if not n.startswith(("input.", "grad.")) and n not in ("output", "loss")}
    return report(saved, dump, sorted(params - set(saved)))


COMMANDS = {"save-dit": save_dit, "compare-dit": compare_dit,
            "save-diffusers": save_diffusers, "compare-diffusers": compare_diffusers}


def main(argv):
    if len(argv) == 3 and argv[1] == "save-scheduler":
        return save_scheduler(argv[2])
    if len(argv) != 4 or argv[1] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[argv[1]](argv[2], argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
