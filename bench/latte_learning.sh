#!/usr/bin/env bash
# Proof that Latte learns videos: train the small Latte of jobs/latte-moving-fashion.yaml on
# moving Fashion-MNIST (docs/data.md) on this machine's CPU, sample 500 videos (50 per class)
# with classifier-free guidance, and measure what a person would check (`difftrain eval
# video`, docs/eval.md) beside the same measures of 500 real test videos:
#   (a) per-frame class accuracy of the cropped garment: target >= 0.7 of the real videos';
#   (b) the garment's track against the best bouncing straight path: residual <= 2x real;
#   (c) the frames of a video agree on the garment's class: agreement >= 0.8.
#
#   bench/latte_learning.sh [STEPS] [CFG]
#       defaults: the job's steps, guidance 14 (DDIM, 25 steps)
#   SEED (default 1) chooses the draw; SKIP_TRAINING=1 scores the last run again.
# Writes docs/images/latte-samples.gif (one row of two videos per class) and
# docs/images/latte-filmstrip.png (the same 20 videos, one row of frames each).
set -euo pipefail
cd "$(dirname "$0")/.."
make build >/dev/null
steps=${1:-}
cfg=${2:-14}
seed=${SEED:-1}
run=runs/latte-moving-fashion
classifier=model/eval/fashion_mnist_classifier.safetensors
# One program at a time, alone on the machine: OpenMP's default wait policy (threads spin
# briefly at a barrier, then sleep). OMP_WAIT_POLICY=passive, right when ranks or tests share
# the cores, costs these small models a sixth to a third of their speed (docs/benchmarks.md).
unset OMP_WAIT_POLICY

start=$(date +%s)
if [[ -z ${SKIP_TRAINING:-} ]]; then
  rm -rf "$run/checkpoints"  # a benchmark trains from scratch
  build/difftrain train --config jobs/latte-moving-fashion.yaml ${steps:+--steps "$steps"}
fi
trained=$(date +%s)
sample=(build/difftrain sample --checkpoint "$run/checkpoints" --classes 0,1,2,3,4,5,6,7,8,9
        --sampler ddim --steps 25 --cfg "$cfg" --batch 50)
"${sample[@]}" --per-class 50 --seed "$seed" --raw "$run/samples-$seed.safetensors"
build/difftrain eval video --classifier "$classifier" --samples "$run/samples-$seed.safetensors" \
  --json "$run/eval-video-$seed.json"
"${sample[@]}" --per-class 2 --seed 2 --gif docs/images/latte-samples.gif \
  --out docs/images/latte-filmstrip.png
sampled=$(date +%s)
echo "training $((trained - start)) s, sampling and scoring $((sampled - trained)) s"
