#!/usr/bin/env bash
# CPU MFU of training steps: samples/s and achieved GFLOP/s of whole training steps against
# the OpenBLAS sgemm GFLOP/s measured in the same run. First DiT-S/4 at 32x32 latents at each
# batch size, then the model of each job in CONFIGS (default: the UNet and Latte learning
# jobs) at its own micro-batch, on synthetic samples.
#   bench/cpu_mfu.sh [BATCH...]        (default batch sizes: 32 64)
#   CONFIGS="jobs/a.yaml ..." bench/cpu_mfu.sh;  BENCH=path/to/bench_cpu_mfu to time another build
# Run it on an otherwise idle machine; results go to docs/benchmarks.md by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${BENCH:-build/bench/bench_cpu_mfu}
[[ -n ${BENCH:-} ]] || make bench >/dev/null
batches=("${@:-32 64}")
configs=${CONFIGS-jobs/unet-fashion.yaml jobs/latte-moving-fashion.yaml}
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-default}"
for b in ${batches[@]}; do
  "$bench" --model DiT-S/4 --input-size 32 --batch "$b" --steps 3 --repeats 5 | tail -1
done
for c in $configs; do
  "$bench" --config "$c" --steps 3 --repeats 5 | tail -1
done
