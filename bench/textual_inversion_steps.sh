#!/bin/sh
# What a textual inversion step costs beside a LoRA step and a whole-model step: SD 1.5's UNet
# at SIZE latents (sample_size; 8 is 64 px, 64 is 512 px), synthetic latents, micro-batch 1,
# trained for STEPS steps as a whole fine-tune (`full`), a LoRA of rank 4 on the attention
# projections (`lora`) and a textual inversion of one vector through SD 1.x's CLIP text model
# (`inversion`: CLIP ViT-L/14's text half with random weights, bench/text_encoder_torch.py save;
# texts from two templates), one after the other, RUNS times. Prints each run's median step time
# (steps 1–2 left out as warm-up) and peak RSS, and the median ratios to LoRA.
#
#   bench/textual_inversion_steps.sh [BUILD_DIR] [SIZE] [STEPS] [RUNS]   (build, 8, 6, 3)
set -eu
build=${1:-build}
size=${2:-8}
steps=${3:-6}
runs=${4:-3}
. "$(dirname "$0")/train_runs.sh"
text_bench_setup inversion_steps "$build"

for kind in full lora inversion; do
  extra=""
  [ "$kind" = lora ] && extra="lora: {rank: 4}"
  [ "$kind" = inversion ] && extra="textual_inversion: {token: '<cat-toy>', initializer_token: toy, text_encoder: $work/sd, templates: ['a photo of a {}', 'a rendering of the {}']}"
  cat >"$work/$kind.yaml" <<EOF
model: {name: SD1.5, sample_size: $size, text_dropout: 0}
data: {kind: synthetic}
batch: {micro: 1, global: 1}
$extra
train: {device: cpu, steps: $steps, log_every: 1000, metrics_file: "$work/$kind-{rank}.jsonl"}
checkpoint: {dir: "$work/$kind-ckpt", every: 100000}
EOF
done

train_runs "$difftrain" "$work" "$runs" full lora inversion

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); SD 1.5 at ${size}x${size} latents"
/usr/bin/python3 - "$work" "$runs" <<'EOF'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
kinds = ("full", "lora", "inversion")
def median_step(kind, run):
    rows = [json.loads(line) for line in open(f"{work}/{kind}-{run}.jsonl") if '"loss"' in line]
    return statistics.median(r["step_seconds"] for r in rows if r["step"] > 2)
ratios = {k: [] for k in kinds}
for run in range(1, runs + 1):
    step = {k: median_step(k, run) for k in kinds}
    rss = {k: int(open(f"{work}/{k}-{run}.rss").read().split()[-1]) / 2**20 for k in kinds}
    for k in kinds:
        ratios[k].append(step[k] / step["lora"])
    print(f"run {run}: " + ", ".join(f"{k} {step[k] * 1000:.0f} ms ({rss[k]:.2f} GiB)"
                                      for k in kinds))
print(f"median over {runs} runs, to LoRA: " +
      ", ".join(f"{k} {statistics.median(ratios[k]):.3f}" for k in kinds))
EOF
