#!/bin/sh
# What DoRA costs a LoRA step: SD 1.5's UNet at 64 px (sample_size 8, where the adapters' own
# work weighs most against the model's), synthetic latents and texts, micro-batch 1, adapters of
# rank 4 on the attention projections (diffusers' targets: 128 modules), trained for STEPS
# steps as a plain LoRA and as DoRA (`lora.use_dora`), one after the other, RUNS times. Prints
# each run's median step time (steps 1–2 left out as warm-up) and peak RSS, the ratio DoRA /
# LoRA per run, and the median ratio.
#
#   bench/dora_steps.sh [BUILD_DIR] [STEPS] [RUNS]     (defaults: build, 8, 3)
set -eu
build=${1:-build}
steps=${2:-8}
runs=${3:-3}
difftrain=$(cd "$build" && pwd)/difftrain
work=$(mktemp -d /tmp/dora_steps.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

for kind in lora dora; do
  dora=false
  [ "$kind" = dora ] && dora=true
  cat >"$work/$kind.yaml" <<EOF
model: {name: SD1.5, sample_size: 8}
data: {kind: synthetic}
batch: {micro: 1, global: 1}
lora: {rank: 4, use_dora: $dora}
train: {device: cpu, steps: $steps, log_every: 1000, metrics_file: "$work/$kind-{rank}.jsonl"}
checkpoint: {dir: "$work/$kind-ckpt", every: 100000}
EOF
done

. "$(dirname "$0")/train_runs.sh"
train_runs "$difftrain" "$work" "$runs" lora dora

/usr/bin/python3 - "$work" "$runs" <<'EOF'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
def median_step(kind, run):
    rows = [json.loads(line) for line in open(f"{work}/{kind}-{run}.jsonl") if '"loss"' in line]
    return statistics.median(r["step_seconds"] for r in rows if r["step"] > 2)
ratios = []
for run in range(1, runs + 1):
    lora, dora = median_step("lora", run), median_step("dora", run)
    rss = {k: int(open(f"{work}/{k}-{run}.rss").read().split()[-1]) / 2**20
           for k in ("lora", "dora")}
    ratios.append(dora / lora)
    print(f"run {run}: LoRA {lora * 1000:.1f} ms ({rss['lora']:.2f} GiB), "
          f"DoRA {dora * 1000:.1f} ms ({rss['dora']:.2f} GiB), DoRA / LoRA {dora / lora:.3f}")
print(f"median DoRA / LoRA over {runs} runs: {statistics.median(ratios):.3f}")
EOF
