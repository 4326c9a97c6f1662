#!/usr/bin/env bash
# Gradient all-reduce time of DiT-S/4 at dp 2 with the Gloo and the MPI communicators, side by
# side in one `mpirun -np 2` (bench/mpi_allreduce.cc): a buffer of the model's trainable
# parameters reduced in 4 MiB buckets (the job spec's default parallel.bucket_mb), every bucket
# issued at once and then waited for, as after backward without overlap; the backends
# alternate, one repetition each, after a barrier.
#   bench/mpi_allreduce.sh [REPETITIONS]      (default 20 per backend, after 2 warm-ups)
#   SKIP_BUILD=1 uses build/ as it is (else `make bench` first).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-20}
[[ -n ${SKIP_BUILD:-} ]] || make bench >/dev/null
floats=$(build/difftrain info --model DiT-S/4 --input-size 32 --num-classes 10 --json |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["trainable_parameters"])')
echo "DiT-S/4 (32x32 latents, 10 classes): $floats trainable parameters; dp 2 under mpirun"
mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_mpi_allreduce \
  --floats "$floats" --bucket-mb 4 --repetitions "$reps"
