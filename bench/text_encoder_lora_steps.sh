#!/bin/sh
# What adapting the text encoder too costs a LoRA step (lora.train_text_encoder): SD 1.5's UNet at
# SIZE latents (sample_size; 8 is 64 px, 64 is 512 px), micro-batch 1, a LoRA of rank 4 on the
# UNet's attention projections (`lora`: the texts' embeddings read from the data's table) and the
# same with SD 1.x's CLIP text model adapted too (`text_lora`: q, k, v and out of its 12 layers;
# CLIP ViT-L/14's text half with random weights, bench/text_encoder_torch.py save, encoding each
# sample's caption every step). The data: 8 pictures of noise with captions, packed through the
# small VAE of tests/reference/sd_pipeline.py (4 latent channels, half the side) and embedded by
# that encoder. Trained for STEPS steps, one kind after the other, RUNS times; prints each run's
# median step time (steps 1–2 left out as warm-up) and peak RSS, and the median ratio to LoRA; and
# the memory `validate` plans for each, the text encoder's on a line of its own.
#
#   bench/text_encoder_lora_steps.sh [BUILD_DIR] [SIZE] [STEPS] [RUNS]   (build, 8, 6, 3)
set -eu
build=${1:-build}
size=${2:-8}
steps=${3:-6}
runs=${4:-3}
. "$(dirname "$0")/train_runs.sh"
text_bench_setup text_encoder_lora_steps "$build"
diffusers=$("$here/tests/reference/diffusers_env.sh" | tail -n 1)
"$diffusers" "$here/tests/reference/sd_pipeline.py" make "$work/sd" 5 sd >/dev/null 2>&1
"$diffusers" - "$work/pictures" $((size * 2)) <<'EOF'
import json, os, sys
import numpy as np
from PIL import Image
folder, side = sys.argv[1], int(sys.argv[2])
os.makedirs(folder)
rng = np.random.default_rng(0)
subjects = ["a red boat", "a dog", "a small house", "two cats"]
with open(os.path.join(folder, "metadata.jsonl"), "w") as jsonl:
    for k in range(8):
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{k}.png"))
        text = f"a photo of {subjects[k % 4]} by the sea, number {k}"
        jsonl.write(json.dumps({"file_name": f"{k}.png", "text": text}) + "\n")
EOF
"$difftrain" data pack --dataset image_folder --path "$work/pictures" --image-size $((size * 2)) \
  --crop square --vae "$work/sd" --text-encoder "$work/sd" --out "$work/latents" >/dev/null 2>&1

for kind in lora text_lora; do
  extra="lora: {rank: 4}"
  [ "$kind" = text_lora ] && extra="lora: {rank: 4, train_text_encoder: true}"
  cat >"$work/$kind.yaml" <<EOF
model: {name: SD1.5, sample_size: $size, text_dropout: 0}
data: {kind: latent_folder, path: "$work/latents"}
batch: {micro: 1, global: 1}
$extra
train: {device: cpu, steps: $steps, log_every: 1000, metrics_file: "$work/$kind-{rank}.jsonl"}
checkpoint: {dir: "$work/$kind-ckpt", every: 100000}
EOF
done

train_runs "$difftrain" "$work" "$runs" lora text_lora
# What the plan predicts of each (`validate`: the rank's memory, with the text encoder's line).
for kind in lora text_lora; do
  echo "$kind planned: $("$difftrain" validate "$work/$kind.yaml" | grep -A1 '^memory per rank' |
    grep -v '^placement' | tr '\n' ' ')"
done

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); SD 1.5 at ${size}x${size} latents"
/usr/bin/python3 - "$work" "$runs" <<'EOF'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
kinds = ("lora", "text_lora")
def median_step(kind, run):
    rows = [json.loads(line) for line in open(f"{work}/{kind}-{run}.jsonl") if '"loss"' in line]
    return statistics.median(r["step_seconds"] for r in rows if r["step"] > 2)
ratios = []
for run in range(1, runs + 1):
    step = {k: median_step(k, run) for k in kinds}
    rss = {k: int(open(f"{work}/{k}-{run}.rss").read().split()[-1]) / 2**20 for k in kinds}
    ratios.append(step["text_lora"] / step["lora"])
    print(f"run {run}: " + ", ".join(f"{k} {step[k] * 1000:.0f} ms ({rss[k]:.2f} GiB)"
                                      for k in kinds))
print(f"median over {runs} runs: text_lora / lora {statistics.median(ratios):.3f}")
EOF
