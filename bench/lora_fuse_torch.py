#!/usr/bin/python3
"""The baseline of bench_lora_fuse: the same LoRA fused in PyTorch as peft's merge does it,
W += alpha/rank · (B @ A) per module in float32 (the weights zeros of each module's shape,
allocated before the clock starts), the median of REPEATS runs.

    PYTHON bench/lora_fuse_torch.py LORA.safetensors REPEATS THREADS

PYTHON: tests/reference/diffusers_env.sh's (PyTorch 1.13).
"""

import statistics
import sys
import time

import torch
from safetensors.torch import load_file


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    torch.set_num_threads(int(argv[3]))
    lora = load_file(argv[1])
    bases = sorted({k.split(".")[0] for k in lora})
    weights = {}
    for base in bases:
        down, up = lora[f"{base}.lora_down.weight"], lora[f"{base}.lora_up.weight"]
        weights[base] = torch.zeros((up.shape[0], down[0].numel()))
    seconds = []
    for _ in range(int(argv[2])):
        start = time.perf_counter()
        for base in bases:
            down = lora[f"{base}.lora_down.weight"].float().flatten(1)
            up = lora[f"{base}.lora_up.weight"].float().flatten(1)
            alpha = float(lora[f"{base}.alpha"])
            weights[base] += (alpha / down.shape[0]) * (up @ down)
        seconds.append(time.perf_counter() - start)
    print(f"PyTorch {torch.__version__} (peft's merge, float32): {len(bases)} modules in "
          f"{statistics.median_high(seconds):.3f} s (median of {len(seconds)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
