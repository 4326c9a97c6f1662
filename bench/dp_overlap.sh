#!/usr/bin/env bash
# Data parallelism over Gloo on this machine: the fraction of step time a rank spends
# waiting for gradient reduction after backward, with bucketed overlap on and off.
#   bench/dp_overlap.sh [DP] [STEPS]      (defaults: 2 ranks, 12 steps)
# Each rank gets one core's share of threads (OMP_NUM_THREADS = cores / DP).
set -euo pipefail
cd "$(dirname "$0")/.."
make build >/dev/null
dp=${1:-2}
steps=${2:-12}
threads=$(( $(nproc) / dp )); (( threads >= 1 )) || threads=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for overlap in true false; do
  cat >"$work/job-$overlap.yaml" <<YAML
model: {name: DiT-S/8, input_size: 32, num_classes: 10}
batch: {micro: 16, global: $((16 * dp))}
train: {steps: $steps, log_every: 1000, metrics_file: "$work/metrics-$overlap-{rank}.jsonl"}
parallel: {overlap: $overlap, bucket_mb: 4}
YAML
  for ((r = 1; r < dp; r++)); do
    OMP_NUM_THREADS=$threads build/difftrain train --config "$work/job-$overlap.yaml" \
      --rank $r --world "$dp" --store "$work/store-$overlap" --log-level warn &
  done
  OMP_NUM_THREADS=$threads build/difftrain train --config "$work/job-$overlap.yaml" \
    --rank 0 --world "$dp" --store "$work/store-$overlap" --log-level warn
  wait
done

/usr/bin/python3 - "$work" "$dp" <<'PY'
import json, statistics, sys
work, dp = sys.argv[1], int(sys.argv[2])
print(f"DiT-S/8 32x32, micro-batch 16 per rank, dp={dp}, Gloo on loopback; median over steps 3..end of rank 0")
for overlap in ("true", "false"):
    rows = [json.loads(l) for l in open(f"{work}/metrics-{overlap}-0.jsonl")][2:]
    step = statistics.median(r["step_seconds"] for r in rows)
    wait = statistics.median(r["comm_wait_seconds"] for r in rows)
    print(f"overlap {overlap:5}: step {step*1000:8.1f} ms, waiting for gradients {wait*1000:7.1f} ms"
          f" = {100*wait/step:5.1f}% of the step")
PY
