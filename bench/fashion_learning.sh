#!/usr/bin/env bash
# Proof that the model learns: train the small DiT of jobs/fashion-mnist.yaml on Debian's
# Fashion-MNIST on this machine's CPU, sample 1,000 images (100 per class) with
# classifier-free guidance, and score them with the project's own classifier: conditional
# accuracy and the Frechet distance (FD) of classifier features against the 10k real test
# images, beside the same distance for 1,000 real training images (the floor).
#
# One draw of 1,000 samples is noisy (its FD moves by about ±5 with the seed, the floor's
# by a factor of two: docs/eval.md), so the samples are drawn with SEEDS seeds, each scored
# against the floor of the same seed, and the script prints every draw and the means.
#
#   bench/fashion_learning.sh [STEPS] [CFG] [CFG_INTERVAL]
#       defaults: the job's steps, guidance 5 applied at timesteps 250..750 (docs/sampling.md)
#   SEEDS="1 3 4 5" (default) chooses the draws; SKIP_TRAINING=1 scores the last run again
#   (otherwise the run's checkpoints, runs/fashion-mnist/checkpoints, are deleted first).
# Writes the sample grid to docs/images/fashion-samples.png.
set -euo pipefail
cd "$(dirname "$0")/.."
make build >/dev/null
steps=${1:-}
cfg=${2:-5}
interval=${3:-250,750}
seeds=${SEEDS:-1 3 4 5}
run=runs/fashion-mnist
classifier=model/eval/fashion_mnist_classifier.safetensors
[[ -f $classifier ]] || build/difftrain eval train-classifier --out "$classifier"
# Several OpenMP programs in a row on few cores: threads wait passively, never spin.
export OMP_WAIT_POLICY=passive

start=$(date +%s)
if [[ -z ${SKIP_TRAINING:-} ]]; then
  rm -rf "$run/checkpoints"  # a benchmark trains from scratch: never resume an earlier run
  build/difftrain train --config jobs/fashion-mnist.yaml ${steps:+--steps "$steps"}
fi
trained=$(date +%s)
sample=(build/difftrain sample --checkpoint "$run/checkpoints" --classes 0,1,2,3,4,5,6,7,8,9
        --sampler ddim --steps 50 --cfg "$cfg" --cfg-interval "$interval")
for seed in $seeds; do
  "${sample[@]}" --per-class 100 --seed "$seed" --raw "$run/samples-$seed.safetensors"
  build/difftrain eval --classifier "$classifier" --samples "$run/samples-$seed.safetensors" \
    --floor --seed "$seed" --json "$run/eval-$seed.json" >/dev/null
done
"${sample[@]}" --per-class 10 --seed 2 --out docs/images/fashion-samples.png
sampled=$(date +%s)

bench/learning_table.py "$run" $seeds
echo "train $((trained - start)) s, sample $((sampled - trained)) s on $(nproc) cores"
