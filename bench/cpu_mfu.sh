#!/usr/bin/env bash
# CPU MFU of a DiT-S/4 training step at 32x32 latents: samples/s and achieved GFLOP/s of
# whole training steps against the OpenBLAS sgemm GFLOP/s measured in the same run.
#   bench/cpu_mfu.sh [BATCH...]        (default batch sizes: 32 64)
# Run it on an otherwise idle machine; results go to docs/benchmarks.md by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
make build >/dev/null
batches=("${@:-32 64}")
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
for b in ${batches[@]}; do
  build/bench/bench_cpu_mfu --model DiT-S/4 --input-size 32 --batch "$b" --steps 3 --repeats 5 | tail -1
done
