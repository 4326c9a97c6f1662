#!/bin/sh
# What aspect-ratio buckets cost a training step: the same pictures packed at one size
# (`--crop square`, 64×64) and into three buckets (`--crop buckets`: 64×64, 48×80, 80×48), and
# a pixel-space UNet trained on each for STEPS steps (every global batch of one bucket, so most
# steps change the model's size). Prints each run's median step time by sample size (the
# metrics file's `sample_size`; steps 1–2 left out as warm-up) and its median TFLOP/s, the FLOPs
# of each step's own size.
#
#   bench/bucket_steps.sh [BUILD_DIR] [STEPS]     (defaults: build, 30)
set -eu
build=${1:-build}
steps=${2:-30}
difftrain=$(cd "$build" && pwd)/difftrain
work=$(mktemp -d /tmp/bucket_steps.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

# 48 pictures: 16 near-square, 16 landscape, 16 portrait, of varied sizes.
/usr/bin/python3 - "$work/pictures" <<'EOF'
import os, sys
import numpy as np
from PIL import Image
out = sys.argv[1]
os.makedirs(out)
rng = np.random.default_rng(0)
for k in range(48):
    base = 64 + 8 * (k % 5)
    w, h = {0: (base, base + k % 3), 1: (base * 5 // 3, base), 2: (base, base * 5 // 3)}[k // 16]
    pixels = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(os.path.join(out, f"{k:02d}.png"))
EOF

"$difftrain" data pack --dataset image_folder --path "$work/pictures" --image-size 64 \
    --crop square --out "$work/square" >/dev/null 2>&1
"$difftrain" data pack --dataset image_folder --path "$work/pictures" --image-size 64 \
    --crop buckets --buckets 64x64,48x80,80x48 --out "$work/buckets" >/dev/null 2>&1

for kind in square buckets; do
  cat >"$work/$kind.yaml" <<EOF
model: {name: unet, in_channels: 3, out_channels: 3, sample_size: 64,
        block_out_channels: [32, 64, 64], layers_per_block: 1, attention_head_dim: 8,
        cross_attention_dim: 32, norm_num_groups: 8, text_length: 8,
        down_block_types: [DownBlock2D, CrossAttnDownBlock2D, CrossAttnDownBlock2D],
        up_block_types: [CrossAttnUpBlock2D, CrossAttnUpBlock2D, UpBlock2D]}
data: {kind: latent_folder, path: "$work/$kind"}
batch: {micro: 8, global: 8}
train: {steps: $steps, log_every: 1000, metrics_file: "$work/$kind-{rank}.jsonl"}
checkpoint: {dir: "$work/$kind-ckpt", every: 100000}
EOF
  "$difftrain" train --config "$work/$kind.yaml" >"$work/$kind.log" 2>&1 ||
    { cat "$work/$kind.log"; exit 1; }
done

/usr/bin/python3 - "$work" <<'EOF'
import json, statistics, sys
work = sys.argv[1]
for kind in ("square", "buckets"):
    rows = [json.loads(line) for line in open(f"{work}/{kind}-0.jsonl") if '"loss"' in line]
    rows = [r for r in rows if r["step"] > 2]
    by_size = {}
    for r in rows:
        size = "x".join(map(str, r.get("sample_size", [64, 64])))
        by_size.setdefault(size, []).append(r["step_seconds"])
    sizes = ", ".join(f"{s}: {statistics.median(t) * 1000:.1f} ms ({len(t)} steps)"
                      for s, t in sorted(by_size.items()))
    tflops = statistics.median(r["flops_per_second"] for r in rows) / 1e12
    print(f"{kind:8s} median step by size: {sizes}; median {tflops:.4f} TFLOP/s")
EOF
