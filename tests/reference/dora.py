#!/usr/bin/python3
"""A DoRA file merged by peft 0.10.0 into the UNet it adapts: the reference of difftrain's
`export --format lora` of a DoRA run, and of FuseLora's DoRA (model/io/lora.h).

    PYTHON tests/reference/dora.py UNET_DIR LORA OUT.safetensors

PYTHON is the interpreter tests/reference/peft_env.sh prints. UNET_DIR: a UNet2DConditionModel
folder. LORA: a file in peft's names, unet.M.lora_A.weight, unet.M.lora_B.weight and
unet.M.lora_magnitude_vector (no alphas: a factor alpha/rank is folded into B). Its modules get
peft's DoRA layers, LoraConfig(r=the file's rank, lora_alpha=r, use_dora=True); peft's
set_peft_model_state_dict loads the file (a shape that is not peft's is an error, as is any
key it leaves unused or any adapter tensor it leaves unset), each layer's merge() fuses it, and
OUT holds every adapted module's merged weight as M.weight (F32).
Exit status: 0; 1 when peft does not take the file as it is; 2 for bad usage.
"""

import sys

import safetensors.torch  # noqa: F401  (before diffusers)
import torch
from diffusers import UNet2DConditionModel
from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file


def merge(unet_dir, lora, out):
    unet = UNet2DConditionModel.from_pretrained(unet_dir)
    state = load_file(lora)
    if not all(k.startswith("unet.") for k in state):
        print("error: every key should start with unet.", file=sys.stderr)
        return 1
    state = {k[len("unet."):]: v for k, v in state.items()}
    suffix = ".lora_A.weight"
    modules = sorted(k[:-len(suffix)] for k in state if k.endswith(suffix))
    ranks = {state[m + suffix].shape[0] for m in modules}
    if len(ranks) != 1:
        print(f"error: ranks {sorted(ranks)}; one expected", file=sys.stderr)
        return 1
    rank = ranks.pop()
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=modules, use_dora=True)
    inject_adapter_in_model(config, unet)
    loaded = set_peft_model_state_dict(unet, state)
    unset = [k for k in loaded.missing_keys if "lora_" in k]
    if loaded.unexpected_keys or unset:
        print(f"error: unused {loaded.unexpected_keys}, unset {unset}", file=sys.stderr)
        return 1
    merged = {}
    with torch.no_grad():
        for name, module in unet.named_modules():
            if isinstance(module, LoraLayer):
                module.merge()
                merged[f"{name}.weight"] = module.get_base_layer().weight.float().contiguous()
    save_file(merged, out)
    print(f"merged {len(merged)} DoRA modules of rank {rank} from {lora}")
    return 0


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    return merge(argv[1], argv[2], argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
