#!/usr/bin/env bash
# Proof that the model learns: train the small DiT of jobs/fashion-mnist.yaml on Debian's
# Fashion-MNIST on this machine's CPU, sample 1,000 images (100 per class) with
# classifier-free guidance, and score them with the project's own classifier:
# conditional accuracy and the Frechet distance of classifier features against the real
# test set, beside the same distance for 1,000 real training images (the floor).
#   bench/fashion_learning.sh [STEPS] [CFG]     (defaults: the job's steps, guidance 2)
# Writes the sample grid to docs/images/fashion-samples.png.
set -euo pipefail
cd "$(dirname "$0")/.."
make build >/dev/null
steps=${1:-}
cfg=${2:-2}
run=runs/fashion-mnist
classifier=model/eval/fashion_mnist_classifier.safetensors
[[ -f $classifier ]] || build/difftrain eval train-classifier --out "$classifier"

start=$(date +%s)
build/difftrain train --config jobs/fashion-mnist.yaml ${steps:+--steps "$steps"}
trained=$(date +%s)
build/difftrain sample --checkpoint "$run/checkpoints" --classes 0,1,2,3,4,5,6,7,8,9 \
  --per-class 100 --sampler ddim --steps 50 --cfg "$cfg" --seed 1 \
  --out "$run/samples.png" --raw "$run/samples.safetensors"
build/difftrain sample --checkpoint "$run/checkpoints" --classes 0,1,2,3,4,5,6,7,8,9 \
  --per-class 10 --sampler ddim --steps 50 --cfg "$cfg" --seed 2 \
  --out docs/images/fashion-samples.png
sampled=$(date +%s)
build/difftrain eval --classifier "$classifier" --samples "$run/samples.safetensors" --floor
echo "train $((trained - start)) s, sample $((sampled - trained)) s on $(nproc) cores"
